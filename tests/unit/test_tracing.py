"""The tracing decision without a configured provider, and where a child configures one."""

from __future__ import annotations

import pytest

import brooq
from brooq import tracing
from brooq.errors import InvalidSettings


def test_without_a_configured_provider_there_is_no_tracer() -> None:
    # The API's default provider is a proxy that drops every span: nothing to pay for.
    assert tracing.refresh() is None
    assert tracing.tracer() is None
    assert tracing.parent(None) is None
    tracing.flush()  # nothing to flush, and no error


def test_a_traceparent_gives_the_consumer_its_parent() -> None:
    from opentelemetry import trace

    context = tracing.parent("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
    span_context = trace.get_current_span(context).get_span_context()
    assert f"{span_context.trace_id:032x}" == "0af7651916cd43dd8448eb211c80319c"
    assert f"{span_context.span_id:016x}" == "b7ad6b7169203331"
    assert span_context.is_remote and span_context.trace_flags.sampled


def test_on_child_start_takes_a_callable_of_no_arguments() -> None:
    queue = brooq.Queue("postgresql:///unused")

    @queue.on_child_start
    def setup() -> None: ...

    assert queue.child_start_hooks == [setup]
    with pytest.raises(InvalidSettings) as refused:
        queue.on_child_start(lambda claim: None)  # type: ignore[arg-type]
    assert refused.value.problems[0].startswith("on_child_start must be callable as fn()")


def test_without_the_extra_installed_there_is_no_tracer() -> None:
    """``opentelemetry`` not importable (brooq without its otel extra): no tracer, and
    brooq imports and enqueues' decision work all the same."""
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['opentelemetry'] = None\n"  # import opentelemetry fails
        "import brooq\n"
        "from brooq import tracing\n"
        "assert tracing.tracer() is None\n"
        "tracing.flush()\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout == "ok\n", out.stderr
