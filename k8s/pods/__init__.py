"""Programs the platform runs in pods, shipped as ConfigMaps: the GPU smoke check, the preflight
fence, the finished-TrainJob cleanup and the TF_CONFIG wrapper of the TensorFlow runtime. Standard
library (and the API server over HTTPS) only.

May import: k8s.pods (nothing else of the project: each runs as a single file)."""
