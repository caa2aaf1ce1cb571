"""The local lab's stand-ins for Proxmox, run on the lab host (this machine), never in a container except nvemu:
``pct.py`` (a pct-compatible CLI over LXC), ``pveapi.py`` (the Proxmox API over the same containers),
``template.py`` (the Debian 12 container template) and ``nvemu.py`` (emulated NVIDIA GPUs: the holder accounting
on the host, ``nvidia-smi`` inside each container). The role lab_host installs them (roles/lab_host/files links
here); each also runs standalone."""
