"""The policy pack run on every preview (``pulumi preview --policy-pack policy``) and offline on the
rendered plan: rules the platform's resources must keep."""
