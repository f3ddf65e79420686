"""What may be done: what a caller's role allows (``roles``), and what the operator lets the
server touch, run and call (``policy``)."""
