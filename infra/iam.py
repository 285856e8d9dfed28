"""Small IAM document helpers shared by the AWS components."""

import json


def assume_role_policy(service: str) -> str:
    """Trust policy letting one AWS service assume the role."""
    return json.dumps({"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Principal": {"Service": service}, "Action": "sts:AssumeRole"}]})
