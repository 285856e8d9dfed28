"""What runs beside the program, not in ``pulumi up``: the offline render under Pulumi's mock
runtime, the API-server judge, the local emulator, the local control plane, golden files."""
