"""Exit codes a worker process uses to tell its nanny what to do (no imports: the
nanny, the CLI and anything else may read them cheaply)."""

from __future__ import annotations

# The worker left the scheduler on purpose (it sent WorkerLeaving and was let go) and
# wants a fresh process under the same name: the nanny restarts it at once, without a
# backoff, and does not count it as a crash. (75 is EX_TEMPFAIL in sysexits.h.)
EXIT_RESTART = 75
