"""The TCP front: where clients connect, wait and are answered.

server.py is the listener (a gevent StreamServer, one greenlet per connection, parking idle
connections and resuming them); connection.py reads a client's requests, hands them to the
command table and writes the replies; session.py is what the commands see of a connection
(and the ServerState every connection shares); gate.py admits connections and throttles
password guesses. Blocking belongs here: a command answers a waiter, the connection waits.
"""
