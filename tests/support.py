"""The helpers that several test modules share, by topic, so no test module imports another:

- support_servers.py: EZRA and redis-server started for real, wait_until, ROOT, NO_RETRY;
- support_queue.py: the queue through redis-py (claim, configure, queue_figures...) and the
  broker in process;
- support_resp.py: the suite's one RESP reply parser, a raw TCP connection, encode_command;
- support_http.py: the dashboard and /metrics;
- support_disk.py: a small tmpfs for the disk-full tests;
- support_files.py: tasks written by hand into a stopped server's file, old-schema files;
- support_compat.py: the compatibility rows, venvs and the Node.js clients;
- support_worker_libs.py: the worker libraries' rows and refusals.

Test modules import from the topic module. This one re-exports every name, so
`from support import wait_until` keeps working. Fixtures stay in conftest.py (no support
module holds one); state that several modules share (WORKER_LIBS_RESULTS) lives in its
topic module, one object whichever way it is imported.
"""

from __future__ import annotations

from support_compat import (COMPAT, KEY, NODE_DIR, NODE_SRC, node_env, node_modules,  # noqa: F401
                            node_version, python_venv, record_results, run_examples)
from support_disk import leave_free, mount_small_tmpfs, tmpfs  # noqa: F401
from support_files import hand_rowids, schema_13_text, write_old_file  # noqa: F401
from support_http import OPENER, NoRedirect, basic, form_token, http, scrape, value  # noqa: F401
from support_queue import (OK_REPLIES, claim, configure, entries_of, pending, queue_figures,  # noqa: F401
                           submit_broken_request, text)
from support_resp import (AGGREGATE_TYPES, BLOB_TYPES, LINE_TYPES, MAP_TYPES, Err, Incomplete,  # noqa: F401
                          Malformed, Reply, RespConnection, blocked_clients, encode_command, errors_in,
                          parse_all, parse_reply, parse_value, plain, raw)
from support_servers import (HTTP_LISTENING, LISTENING, NO_RETRY, ROOT, EzraProcess, free_port,  # noqa: F401
                             make_certificates, start_redis_server, wait_until)
from support_worker_libs import (PIPELINED, REFUSAL, VENV_REDIS5_REQUIREMENTS,  # noqa: F401
                                 VENV_REQUIREMENTS, WORKER_LIBS_RESULTS, Row, dist_version, first_refusal,
                                 record_worker_libs, refusals, run_json, short, walrus_database)
