"""The durable record of a job.

The session journal (writer, recovery scan, replay map, ``journal show``) and the durable conversation.

Private; import from the modules themselves. This ``__init__`` imports nothing.
"""
