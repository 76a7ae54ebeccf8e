"""The wire: what a Redis client sends and reads, and nothing of the queue.

request_reader.py reads requests (RESP frames and inline commands, inline.py splits the
latter); resp.py writes every reply, RESP2 or RESP3; integers.py reads integers as Redis
does (string2ll); stream_ids.py is the grammar of task ids. task_fields.py holds the stored
form of a task's fields, which is the wire's own RESP array (a claim sends those bytes on as
they are), so it lives beside resp.py. The front and the commands use these modules, and so
does the client side (adapters/); they import only the error catalogue (errors.py) and, for
the older JSON form of stored fields, storage's decoder.
"""
