"""Tools an episode's model can call: the registry (built-ins and `package.module:function`) and dispatch.

    tools = load_tools(["python", "my_tools:lookup"])        # {name: Tool}
    result = dispatch(tools, call, max_chars=1000)          # ToolResult(text, ok)

A user tool is a plain function; its JSON schema (what the chat template shows the model) comes from
its signature (str/int/float/bool/list/dict annotations; parameters without a default are
required) and its docstring's first paragraph. Dispatch never raises for the model's mistakes: an
unknown name, arguments that do not fit the signature, a tool that raises or is killed all come
back as `ok=False` with a message the model can read. Tools run on every replay of an episode
(workers/env.py), so they should have no lasting side effects.
"""

from __future__ import annotations

import functools
import inspect
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from streamrl.core.errors import ConfigError
from streamrl.core.imports import import_spec
from streamrl.envs.tool_calls import ToolCall

_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array", dict: "object"}
_CHECK = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
}


@dataclass
class Tool:
    name: str
    fn: Callable[..., Any]
    description: str
    parameters: dict
    """JSON schema of the arguments object."""

    def schema(self) -> dict:
        """The OpenAI/Hugging Face tool schema chat templates take (`tools=`)."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


@dataclass
class ToolResult:
    text: str
    ok: bool
    """False: the call was invalid or the tool failed (counted in tool_errors)."""


def tool_from_function(fn: Callable, name: str | None = None) -> Tool:
    """A Tool whose schema is read from `fn`'s signature and docstring."""
    props, required = {}, []
    for p in inspect.signature(fn).parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        ann = (
            p.annotation
            if not isinstance(p.annotation, str)
            else {"str": str, "int": int, "float": float, "bool": bool, "list": list, "dict": dict}.get(p.annotation)
        )
        props[p.name] = {"type": _JSON_TYPES[ann]} if ann in _JSON_TYPES else {}
        if p.default is p.empty:
            required.append(p.name)
    doc = inspect.getdoc(fn) or ""
    return Tool(
        name or fn.__name__,
        fn,
        doc.split("\n\n")[0].strip(),
        {"type": "object", "properties": props, "required": required},
    )


def _python(code: str, limits) -> ToolResult:
    """Run Python code in the sandbox (streamrl/envs/sandbox/executor.py): what it printed, and how it ended when a
    limit stopped it (a call that failed: ok=False). A program that raises is a result (ok=True):
    its traceback is what the model needs to see."""
    from streamrl.envs.sandbox.executor import run_python

    r = run_python(code, limits)
    parts = [r.stdout.rstrip("\n")] if r.stdout else []
    if r.stderr:
        parts.append("[stderr]\n" + r.stderr.rstrip("\n"))
    if r.truncated:
        parts.append("[output truncated]")
    if r.reason:
        parts.append(f"[killed: {r.reason} limit]" if r.reason != "signal" else "[killed by a signal]")
        return ToolResult("\n".join(parts), ok=False)
    if r.exit_code:
        parts.append(f"[exit code {r.exit_code}]")
    return ToolResult("\n".join(parts) or "[no output]", ok=True)


def python(code: str) -> str:
    """Run a Python program in a sandbox (no network, no files outside a scratch directory, CPU/memory/time limits) and return its stdout and stderr."""
    return _python(code, None).text


@functools.cache
def _sandbox_check() -> None:
    from streamrl.envs.sandbox.executor import sandbox_problem

    if problem := sandbox_problem():  # once per process: fail the env worker's start, not every call
        raise ConfigError(f"tools.names lists python, but {problem}")


def _python_tool(limits: dict) -> Tool:
    from streamrl.envs.sandbox.executor import SandboxLimits

    try:
        bounds = SandboxLimits(**limits)
    except TypeError as exc:
        raise ConfigError(
            f"tools.sandbox: {exc}; its keys are SandboxLimits fields (streamrl/envs/sandbox/executor.py)"
        ) from None
    _sandbox_check()
    tool = tool_from_function(python)
    tool.fn = lambda code: _python(code, bounds)
    return tool


BUILTIN_TOOLS: dict[str, Callable[[dict], Tool]] = {"python": _python_tool}


def load_tools(specs: list[str], sandbox: dict | None = None) -> dict[str, Tool]:
    """{name: Tool} for built-in names and `package.module:function` specs; `sandbox`: SandboxLimits
    fields for the python tool. ConfigError names the fix."""
    tools: dict[str, Tool] = {}
    for spec in specs:
        if spec in BUILTIN_TOOLS:
            tool = BUILTIN_TOOLS[spec](sandbox or {})
        elif ":" in spec:
            _, attr, fn = import_spec(spec, f"tools.names entry {spec!r}", "install it or add its folder to PYTHONPATH")
            if not callable(fn):
                raise ConfigError(f"tools.names entry {spec!r}: the module has no function {attr!r}")
            tool = tool_from_function(fn)
        else:
            raise ConfigError(
                f"tools.names entry {spec!r} is not a built-in tool ({', '.join(BUILTIN_TOOLS)}); "
                "name your own as package.module:function"
            )
        if tool.name in tools:
            raise ConfigError(f"tools.names: two tools are called {tool.name!r}; rename one function")
        tools[tool.name] = tool
    return tools


def clip(text: str, max_chars: int) -> str:
    """`text` cut to about max_chars, keeping its head and tail (a traceback's last line matters)."""
    if len(text) <= max_chars:
        return text
    keep = max_chars // 2
    return f"{text[:keep]}\n[... {len(text) - 2 * keep} characters cut ...]\n{text[-keep:]}"


def _bad_arguments(tool: Tool, args: dict) -> str:
    props, required = tool.parameters.get("properties", {}), tool.parameters.get("required", [])
    if missing := [r for r in required if r not in args]:
        return f"missing argument(s) {missing}"
    if unknown := [a for a in args if a not in props]:
        return f"unknown argument(s) {unknown}; {tool.name} takes {sorted(props)}"
    for key, value in args.items():
        kind = props[key].get("type")
        if kind and (not isinstance(value, _CHECK[kind]) or (kind != "boolean" and isinstance(value, bool))):
            return f"argument {key!r} must be a {kind}, got {json.dumps(value)[:40]}"
    return ""


def dispatch(tools: dict[str, Tool], call: ToolCall, max_chars: int = 1000) -> ToolResult:
    """Run `call`; every failure is a ToolResult(ok=False) whose text tells the model what went wrong."""
    if call.error:
        return ToolResult(f"error: invalid tool call: {call.error}", ok=False)
    tool = tools.get(call.name)
    if tool is None:
        return ToolResult(
            f"error: unknown tool {call.name!r}; available: {', '.join(sorted(tools)) or 'none'}", ok=False
        )
    if problem := _bad_arguments(tool, call.arguments):
        return ToolResult(f"error: bad arguments for {tool.name}: {problem}", ok=False)
    try:
        out = tool.fn(**call.arguments)
    except Exception as exc:  # noqa: BLE001 (the tool's failure is the model's observation, not the episode's end)
        return ToolResult(f"error: {tool.name} raised {type(exc).__name__}: {clip(str(exc), max_chars)}", ok=False)
    if isinstance(out, ToolResult):
        return ToolResult(clip(out.text, max_chars), out.ok)
    text = out if isinstance(out, str) else json.dumps(out, default=str)
    return ToolResult(clip(text, max_chars), ok=True)


def check_tools(cfg) -> str | None:
    """Pre-flight (streamrl/launch/preflight.py): the tools of tools.names load (their modules import, the
    python tool's sandbox works here); the problem, or None."""
    if not cfg.tools.names:
        return None
    try:
        load_tools(cfg.tools.names, cfg.tools.sandbox)
    except ConfigError as exc:
        return str(exc)
    return None
