"""The mount plugins on real mounts (NFS through a recording stand-in for mount(8))."""
