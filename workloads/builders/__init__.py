"""Pure builders of training runs: a run's code ConfigMap and TrainJob from the job model, and
:class:`job_platform.JobPlatform`, what a run needs of the platform it runs on. No Pulumi.

May import: config, k8s.builders, workloads.builders."""
