"""fairq's composition root: the ``fairq`` command line and the local stack (``fairq up``)."""
