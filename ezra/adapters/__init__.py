"""The client side: code that runs in other processes and talks to EZRA over its port.

celery.py (a kombu transport), dramatiq.py (a Dramatiq broker) and taskiq.py (a taskiq-redis
stream broker) let those frameworks run on EZRA, and celery_results.py, dramatiq_results.py and
taskiq_results.py keep their results in EZRA, over result_slots.py (a task per result in a results
queue); leases.py renews the leases their workers
hold; priorities.py is XADD PRIORITY's range, which their priorities map onto; client.py
is the small RESP2 client the command-line tools use. They import only each
other and ezra/protocol/ (the shared grammar), never the server's parts, and the frameworks'
modules are imported only here: users type ezra.celery, ezra.dramatiq and ezra.taskiq, thin
modules at the package's root that re-export these.
"""
