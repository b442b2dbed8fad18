"""Layer 5, what survives the process: the tuning database (`db`), what an entry is and how it is
checked (`records`), how its files are opened and locked (`files`), and pycudnn.torch's routing
decisions (`routes`)."""
