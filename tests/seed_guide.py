"""The seed backend integration guide's requests as its clients send them (the create body byte
for byte) and the names it gives jobs."""

from __future__ import annotations

import re

# The guide's create request, as written in its "Create" section.
GUIDE_CREATE = b"""{
  "user_id": "user123",
  "namespace": "user-123",
  "framework": "pytorch",
  "training_code": "import torch\\nimport torch.nn as nn\\n...",
  "config": {
    "num_nodes": 2,
    "gpu_per_node": 1,
    "cpu_per_node": 4,
    "memory_per_node": "16Gi"
  }
}"""
TIMESTAMP_NAME = re.compile(r"^user123-job-(\d{14})$")
