"""trainctl: submit and follow TrainJobs on the platform from a code directory (``trainctl --help``)."""
