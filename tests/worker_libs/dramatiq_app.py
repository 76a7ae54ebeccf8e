"""dramatiq with its RedisBroker: `dramatiq dramatiq_app`."""

import dramatiq
from dramatiq.brokers.redis import RedisBroker

from scenario import PORT, QUEUE, done, report

dramatiq.set_broker(RedisBroker(host="127.0.0.1", port=PORT, namespace=QUEUE))


@dramatiq.actor
def work(n):
    done(n)


def produce(n: int) -> None:
    pushed, error = 0, None
    try:
        for i in range(n):
            work.send(i)
            pushed += 1
    except Exception as failure:
        error = failure
    report(dramatiq.__version__, pushed, error)
