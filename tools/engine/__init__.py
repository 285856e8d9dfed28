"""The Pulumi engine, run for real: its CLI and Kubernetes provider built from their Go modules
(``build.py``, ``make engine-build``) and our Python language host (``language_host.py``)."""
