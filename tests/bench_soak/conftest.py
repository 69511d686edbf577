"""The chaos bench's fake raypd endpoint (streaming completions whose prompt names what to do,
`/admin/nodes` answering what the test sets), shared rather than copied."""
from tests.bench_chaos.conftest import server  # noqa: F401 - a fixture, found by name
