"""huey's RedisHuey: `huey_consumer huey_app.huey`."""

import huey as huey_package
from huey import RedisHuey

from scenario import PORT, QUEUE, done, report

huey = RedisHuey(QUEUE, host="127.0.0.1", port=PORT)


@huey.task()
def work(n):
    done(n)


def produce(n: int) -> None:
    pushed, error = 0, None
    try:
        for i in range(n):
            work(i)  # enqueues; returns a Result
            pushed += 1
    except Exception as failure:
        error = failure
    report(huey_package.__version__, pushed, error)
