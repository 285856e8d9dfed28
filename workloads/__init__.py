"""The training runs.

- ``workloads/programs/``: the training programs (DDP, FSDP, TensorFlow, the all-reduce check) and
  their shared library, copied into the image and shipped in each run's code ConfigMap;
- ``Dockerfile`` and ``requirements*.txt``: the training image;
- ``workloads/builders/``: pure builders of a run's objects (code ConfigMap, TrainJob) and what a run
  needs of its platform (job_platform);
- ``trainjobs.py``: the components that register runs: the platform stack's ``trainjobs.*`` and a
  TrainJob stack's single run;
- ``Pulumi.yaml``, ``Pulumi.<run>.yaml`` and ``__main__.py``: a Pulumi project whose stacks are runs
  on a platform stack (``cd workloads && pulumi up -s fsdp``).

May import: config, k8s.builders, workloads.builders, infra, k8s, workloads."""
