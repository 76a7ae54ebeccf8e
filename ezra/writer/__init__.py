"""The single writer: every database operation goes through here, in order.

writer.py runs one transaction per loop turn and commits it (batch.py: that turn's Batch, each
Request submitted to it, an EXEC's Atomic); syncer.py fsyncs the WAL off the loop once fsyncs
grow slow; disk_space.py is the full-disk mode (the reserve file, which pushes are refused
and when there is room again); histogram.py keeps the commit and fsync times for the figures.
transactions.py is how the broker's parts declare a method a transaction, with its policy.
"""
