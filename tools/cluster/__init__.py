"""The local control plane: etcd, kube-apiserver and the pinned controllers (Trainer, JobSet, Kueue,
Karpenter with its kwok provider, kwok) built from their Go modules, the bare API server that
judges every object, and applying a rendered plan to them."""
