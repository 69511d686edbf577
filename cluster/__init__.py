"""raypd's deployment surface: the command line (and, later, the Ray Serve ingress and launcher)."""
