"""``deepspeed.launcher``: ``runner`` is the ``zero-ref`` command, the ``deepspeed`` launcher's counterpart."""
