"""Render an Ollama model's Go chat template (from `/api/show`) the way Ollama's `template.Execute` does (pure).

    /api/show template ──parse──▶ OllamaTemplate ──render(messages, tools)──▶ prompt segments (no BOS)

What Ollama does before and around the template, reproduced here (template/template.go, server/routes.go):

- the model's default system prompt (`/api/show` `system`) is prepended when the chat does not start with one;
- `collate`: every system message's content is joined with a blank line into `.System` (system messages stay in
  `.Messages` too), and consecutive messages of one role, except `tool`, merge with a blank line between contents;
- a template that mentions `Messages` runs once over {System, Messages, Tools, Response: "", Think...}; any other
  ("legacy") template runs once per turn with {System, Prompt, Response}, and for the last turn everything after
  its `.Response` is cut off, so the prompt ends where the model starts writing;
- a template that mentions neither `Messages` nor `Response` gets `{{ .Response }}` appended;
- tool-call arguments and tool schemas print as the JSON Go marshals (sorted map keys, HTML-escaped).

Templates that depend on the request's `think` flag, and anything the interpreter does not reproduce, raise
TemplateError: the caller then counts the chat another way.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.tokens.count import Message, Tool
from gateway.tokens.gotemplate_exec import Execution
from gateway.tokens.gotemplate_parse import Action, Branch, Chain, Field, Pipe, TemplateError, Text, Variable, parse
from gateway.tokens.gotemplate_values import GoList, GoMap, GoStruct, JsonObject

__all__ = ["OllamaTemplate", "RenderedChat", "TemplateError"]
_THINK_VARS = frozenset({"think", "thinklevel", "isthinkset"})
_RESPONSE = Action(Pipe((), False, ((Field(("Response",)),),)))


@dataclass(frozen=True, slots=True)
class RenderedChat:
    """The prompt in segments (cut where each message starts), and whether it is what Ollama renders exactly."""

    segments: list[str]
    exact: bool
    images: int

    @property
    def text(self) -> str:
        return "".join(self.segments)


@dataclass(frozen=True, slots=True)
class _Msg:
    role: str
    content: str
    thinking: str
    images: int
    tool_calls: tuple[GoStruct, ...]
    tool_name: str
    tool_call_id: str


class OllamaTemplate:
    """One model's chat template, parsed once; `render` is pure and thread-safe."""

    def __init__(self, source: str, *, system: str = "") -> None:
        self.source = source
        self.system = system
        nodes = parse(source)
        self.vars = frozenset(name.lower() for name in _identifiers(nodes))
        if "messages" not in self.vars and "response" not in self.vars:
            nodes = (*nodes, _RESPONSE)
        self.nodes = nodes
        self.uses_messages = "messages" in self.vars
        self._last_turn = None if self.uses_messages else _cut_after_response(nodes)

    def render(self, messages: Sequence[Message], tools: Sequence[Tool] = (), *, today: dt.date) -> RenderedChat:
        """The prompt Ollama renders for this chat (raises TemplateError)."""
        if self.vars & _THINK_VARS:
            raise TemplateError("the template depends on the request's think setting")
        msgs = [_message(m) for m in messages]
        if self.system and (not msgs or msgs[0].role != "system"):
            msgs.insert(0, _Msg("system", self.system, "", 0, (), "", ""))
        system, collated = _collate(msgs)
        images = sum(m.images for m in collated)
        exact = not images and not tools
        if self.uses_messages:
            data = {
                "System": system,
                "Messages": [_template_message(m) for m in collated],
                "Tools": GoList([_tool(t) for t in tools]) if tools else GoList(is_nil=True),
                "Response": "",
                "Think": False,
                "ThinkLevel": "",
                "IsThinkSet": False,
            }
            run = Execution(data, today=today)
            run.run(self.nodes)
            return RenderedChat(run.segments(), exact, images)
        return RenderedChat(self._legacy(collated, today), exact, images)

    def _legacy(self, collated: Sequence[_Msg], today: dt.date) -> list[str]:
        segments: list[str] = []
        turn = {"System": "", "Prompt": "", "Response": ""}

        def execute(nodes: Sequence[Any]) -> None:
            run = Execution({**turn, "Think": False, "ThinkLevel": "", "IsThinkSet": False}, today=today)
            segments.append(run.run(nodes))
            turn.update(System="", Prompt="", Response="")

        for m in collated:
            if m.role == "system":
                if turn["Prompt"] or turn["Response"]:
                    execute(self.nodes)
                turn["System"] = m.content
            elif m.role == "user":
                if turn["Response"]:
                    execute(self.nodes)
                turn["Prompt"] = m.content
            elif m.role == "assistant":
                turn["Response"] = m.content
        assert self._last_turn is not None
        execute(self._last_turn)
        return [s for s in segments if s]


def _message(message: Message) -> _Msg:
    role = str(message.get("role") or "").lower()
    content = message.get("content")
    images = len(message.get("images") or ())
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, Mapping) and part.get("type") == "text":
                texts.append(str(part.get("text", "")))
            elif isinstance(part, Mapping) and part.get("type") in ("image_url", "image", "input_image"):
                images += 1
            else:
                raise TemplateError("a content part Ollama does not accept")
        content = "\n\n".join(texts)  # Ollama's OpenAI layer makes a message per part; collate joins them again
    elif content is None:
        content = ""
    elif not isinstance(content, str):
        raise TemplateError("message content is neither text nor parts")
    if images:
        content = "".join(f"[img-{i}]" for i in range(images)) + content  # approximate: Ollama numbers chat-wide
    calls = tuple(_tool_call(c, i) for i, c in enumerate(message.get("tool_calls") or ()))
    thinking = message.get("thinking") or message.get("reasoning_content") or ""
    return _Msg(role, content, str(thinking), images, calls, str(message.get("tool_name") or ""),
                str(message.get("tool_call_id") or ""))


def _tool_call(call: Any, index: int) -> GoStruct:
    function = call.get("function") if isinstance(call, Mapping) else None
    if not isinstance(function, Mapping):
        raise TemplateError("tool call without a function")
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = orjson.loads(arguments) if arguments.strip() else None
        except orjson.JSONDecodeError as exc:
            raise TemplateError(f"tool call arguments are not JSON: {exc}") from exc
    if arguments is not None and not isinstance(arguments, dict):
        raise TemplateError("tool call arguments are not an object")
    fn = GoStruct("templateToolCallFunction", {"Index": function.get("index", index) or 0,
                                                "Name": str(function.get("name") or ""),
                                                "Arguments": GoMap(arguments)})
    return GoStruct("templateToolCall", {"ID": str(call.get("id") or ""), "Function": fn})


def _collate(msgs: list[_Msg]) -> tuple[str, list[_Msg]]:
    system: list[str] = []
    collated: list[_Msg] = []
    for m in msgs:
        if m.role == "system":
            system.append(m.content)
        if collated and collated[-1].role == m.role and m.role != "tool":
            last = collated[-1]
            collated[-1] = _Msg(last.role, last.content + "\n\n" + m.content, last.thinking, last.images + m.images,
                                last.tool_calls, last.tool_name, last.tool_call_id)
        else:
            collated.append(m)
    return "\n\n".join(system), collated


def _template_message(m: _Msg) -> GoStruct:
    return GoStruct("templateMessage", {
        "Role": m.role, "Content": m.content, "Thinking": m.thinking, "Images": [b""] * m.images,
        "ToolCalls": list(m.tool_calls) or None, "ToolName": m.tool_name, "ToolCallID": m.tool_call_id,
    })


def _tool(tool: Tool) -> GoStruct:
    """Ollama's templateTool: String() is its JSON, in struct field order."""
    function = tool.get("function")
    if not isinstance(function, Mapping):
        raise TemplateError("a tool without a function")
    params = function.get("parameters") or {}
    if not isinstance(params, Mapping):
        raise TemplateError("tool parameters are not an object")
    raw_props = params.get("properties")
    props = {str(k): _property(v) for k, v in raw_props.items()} if isinstance(raw_props, Mapping) else None
    params_json = JsonObject(type=str(params.get("type") or ""))
    for key, name in (("$defs", "$defs"), ("items", "items"), ("required", "required")):
        if params.get(key):
            params_json[name] = params[key]
    params_json["properties"] = {k: v.json for k, v in props.items()} if props is not None else None
    parameters = GoStruct("templateToolFunctionParameters", {
        "Type": params_json["type"], "Defs": params.get("$defs"), "Items": params.get("items"),
        "Required": params.get("required"), "Properties": GoMap(props) if props is not None else GoMap(None),
    }, json=params_json)
    fn_json = JsonObject(name=str(function.get("name") or ""), description=str(function.get("description") or ""),
                         parameters=params_json)
    fn = GoStruct("templateToolFunction", {"Name": fn_json["name"], "Description": fn_json["description"],
                                           "Parameters": parameters}, json=fn_json)
    tool_json = JsonObject(type=str(tool.get("type") or ""))
    if tool.get("items"):
        tool_json["items"] = tool["items"]
    tool_json["function"] = fn_json
    return GoStruct("templateTool", {"Type": tool_json["type"], "Items": tool.get("items"), "Function": fn},
                    json=tool_json, stringer=True)


def _property(raw: Any) -> GoStruct:
    """api.ToolProperty: only its known fields survive Ollama's decoding, in this order."""
    if not isinstance(raw, Mapping):
        raise TemplateError("a tool property is not an object")
    out = JsonObject()
    if raw.get("anyOf"):
        out["anyOf"] = [_property(p).json for p in raw["anyOf"]]
    kind = raw.get("type")
    if kind:
        out["type"] = kind if isinstance(kind, str) or len(kind) != 1 else kind[0]
    for key in ("items", "description", "enum"):
        if raw.get(key):
            out[key] = raw[key]
    if isinstance(raw.get("properties"), Mapping):
        out["properties"] = JsonObject({str(k): _property(v).json for k, v in raw["properties"].items()})
    if raw.get("required"):
        out["required"] = raw["required"]
    fields = {"Type": out.get("type", ""), "Description": str(raw.get("description") or ""),
              "Enum": raw.get("enum"), "Items": raw.get("items")}
    return GoStruct("ToolProperty", fields, json=out)


def _identifiers(nodes: Sequence[Any]) -> list[str]:
    """Ollama's `Identifiers`: every field and variable name in actions and branch pipelines."""
    names: list[str] = []
    for node in nodes:
        if isinstance(node, Action):
            names += _pipe_identifiers(node.pipe)
        elif isinstance(node, Branch):
            names += _pipe_identifiers(node.pipe) + _identifiers(node.body) + _identifiers(node.orelse or ())
    return names


def _pipe_identifiers(pipe: Pipe) -> list[str]:
    names: list[str] = []
    for cmd in pipe.cmds:
        for arg in cmd:
            if isinstance(arg, Field):
                names += arg.names
            elif isinstance(arg, Variable):
                names += [arg.name, *arg.names]
            elif isinstance(arg, Pipe):
                names += _pipe_identifiers(arg)
    return names


class _Cutter:
    """Ollama's `deleteNode` over the template: keep everything up to the first `.Response` field, drop the rest."""

    def __init__(self) -> None:
        self.cut = False

    def nodes(self, nodes: Sequence[Any]) -> tuple[Any, ...]:
        kept = []
        for node in nodes:
            if self.cut:
                continue
            walked = self.node(node)
            if walked is not None:
                kept.append(walked)
        return tuple(kept)

    def node(self, node: Any) -> Any:
        if isinstance(node, Text):
            return node
        if isinstance(node, Action):
            pipe = self.pipe(node.pipe)
            return None if pipe is None else Action(pipe)
        if isinstance(node, Branch):
            body = self.nodes(node.body)
            if node.orelse is None:
                return Branch(node.kind, node.pipe, body, None)
            if self.cut:
                raise TemplateError("Ollama cannot cut this legacy template after .Response")
            return Branch(node.kind, node.pipe, body, self.nodes(node.orelse))
        return node

    def pipe(self, pipe: Pipe) -> Pipe | None:
        cmds = []
        for cmd in pipe.cmds:
            args: list[Any] = []
            for arg in cmd:
                if self.cut:
                    continue
                if isinstance(arg, Field) and "Response" in arg.names:
                    self.cut = True
                    args.append(arg)
                elif isinstance(arg, Pipe):
                    inner = self.pipe(arg)
                    if inner is not None:
                        args.append(inner)
                elif isinstance(arg, Chain):
                    inner = self.pipe(arg.node)
                    if inner is not None:
                        args.append(Chain(inner, arg.names))
                else:
                    args.append(arg)
            if not args:
                return None
            cmds.append(tuple(args))
        return Pipe(pipe.decl, pipe.assign, tuple(cmds)) if cmds else None


def _cut_after_response(nodes: Sequence[Any]) -> tuple[Any, ...]:
    return _Cutter().nodes(nodes)
