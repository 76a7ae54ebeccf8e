"""HTTP in tests: the dashboard's pages and forms, and /metrics read with prometheus_client's parser."""

from __future__ import annotations

import base64
import re
import urllib.error
import urllib.request
from urllib.parse import quote

from prometheus_client.parser import text_string_to_metric_families


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None  # a 303 is the answer we check, not a page to follow


OPENER = urllib.request.build_opener(NoRedirect)


def http(url: str, data: bytes | None = None, headers: dict | None = None, opener=OPENER) -> tuple[int, dict, bytes]:
    request = urllib.request.Request(url, data=data, headers=headers or {})
    try:
        with opener.open(request, timeout=10) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


def basic(password: str, user: str = "admin") -> dict:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def scrape(server, headers=None) -> dict:
    """{(metric sample name, frozenset(labels)): value} from /metrics."""
    status, response_headers, body = http(server.http_url + "/metrics", headers=headers)
    assert status == 200, body
    assert response_headers["Content-Type"].startswith("text/plain; version=0.0.4")
    samples = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def value(samples: dict, name: str, **labels) -> float:
    return samples[(name, frozenset(labels.items()))]


def form_token(server, queue: str) -> str:
    status, _, body = http(f"{server.http_url}/queue?name={quote(queue)}")
    assert status == 200
    return re.search(rb'name="csrf" value="([0-9a-f]+)"', body).group(1).decode()
