"""eagle3-ops: Ansible automation for EAGLE-3 drafters on Proxmox GPU containers."""

__version__ = "0.1.0"
