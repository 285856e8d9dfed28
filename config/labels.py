"""The platform's own node labels, shared by the components that set them and the builders that
select on them."""

NODE_ROLE_LABEL = "training-platform/node-role"  # "system" on the managed node groups
ARCH_LABEL = "training-platform/arch"  # the managed node groups' architecture (arm64, amd64)
