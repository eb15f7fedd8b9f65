"""llama-server's (and vLLM's) flag names on ``sluice serve`` and ``sluice models``: the
argparse side of ``sluice.cli.serve_gguf``. A flag whose meaning sluice does not have is
refused by name, never ignored."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sluice.cli.serve_gguf import LlamaFlags, apply_llama_flags
from sluice.config import Config


def split_values(values: str | list[str]) -> list[str]:
    """Comma-separated values (llama-server's lists), from one flag or several."""
    items = [values] if isinstance(values, str) else values
    return [part.strip() for item in items for part in item.split(",") if part.strip()]


REFUSED_POOLING = {
    "none": "per-token embeddings are not served (OpenAI's and Ollama's embeddings are one "
            "vector per input); use mean, cls or last",
}


REFUSED_REASONING_FORMAT = {
    "none": "sluice returns a thinking model's thinking apart from its answer "
            "(reasoning_content) on every API; a model without a reasoning table returns "
            "all of its output as content",
    "deepseek-legacy": "sluice does not also leave the <think> tags in content; the "
                       "thinking is in reasoning_content",
}
"""``--reasoning-format`` values whose meaning sluice does not have (``auto`` and
``deepseek`` are what it does)."""

REASONING_VALUES = {"on": "on", "enabled": "on", "true": "on", "1": "on",
                    "off": "off", "disabled": "off", "false": "off", "0": "off",
                    "auto": "auto", "-1": "auto"}
"""``--reasoning``'s values as llama-server reads them (its truthy, falsy and auto words)."""


def _reasoning(value: str) -> str:
    try:
        return REASONING_VALUES[value.lower()]
    except KeyError:
        raise argparse.ArgumentTypeError(f"give on, off or auto, not {value!r}") from None


def llama_flags_config(args: argparse.Namespace, config: Config) -> Config:
    """``config`` with the model files and llama-server flags of ``args`` applied
    (``apply_llama_flags``); ``ValueError`` names a flag whose value is refused."""
    template = args.chat_template
    if args.chat_template_file:
        template = Path(args.chat_template_file).read_text(encoding="utf-8")
    keys = split_values(args.api_key or [])
    if os.environ.get("SLUICE_API_KEY"):
        keys.append(os.environ["SLUICE_API_KEY"])
    if args.reasoning_format in REFUSED_REASONING_FORMAT:
        raise ValueError(f"--reasoning-format {args.reasoning_format}: "
                         f"{REFUSED_REASONING_FORMAT[args.reasoning_format]}")
    if args.pooling in REFUSED_POOLING:
        raise ValueError(f"--pooling {args.pooling}: {REFUSED_POOLING[args.pooling]}")
    flags = LlamaFlags(
        ctx_size=args.ctx_size, parallel=args.parallel, threads=args.threads,
        batch_size=args.batch_size, n_gpu_layers=args.n_gpu_layers, chat_template=template,
        no_repack=args.no_repack, kv_unified=args.kv_unified, temperature=args.temp,
        seed=None if args.seed is None or args.seed < 0 else args.seed,
        n_predict=args.n_predict, embedding=args.embedding or args.reranking,
        pooling="rank" if args.reranking else args.pooling,
        api_keys=tuple(keys), aliases=tuple(args.alias or ()),
        tags=tuple(split_values(args.tags or [])), verbose=args.verbose,
        keep_alive=args.keep_alive or os.environ.get("SLUICE_KEEP_ALIVE"),
        pins=tuple(args.pin or ()),
        reasoning=args.reasoning, reasoning_budget=args.reasoning_budget,
    )
    files = [Path(f) for f in [*args.model_files, *(args.model or [])]]
    return apply_llama_flags(config, files, flags)


class _Refused(argparse.Action):
    """A llama-server flag whose meaning sluice does not have: naming it is an error that
    says why (never ignored)."""

    def __init__(self, option_strings: Sequence[str], dest: str, why: str = "",
                 **kwargs: Any) -> None:
        self.why = why
        super().__init__(option_strings, dest, nargs=0, help=f"refused: {why}",
                         default=argparse.SUPPRESS)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        parser.error(f"{option_string}: {self.why}")


class _Names(argparse.Action):
    """``--alias`` / ``--served-model-name``, appended in order. llama-server names a
    model by the alphabetically first of its ``--alias`` names (they are a set there);
    vLLM by the first ``--served-model-name``: each value is stored with its model id
    first."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        value = str(values)
        if option_string == "--alias":
            parts = [p.strip() for p in value.split(",")]
            if all(parts):
                first = min(parts)
                value = ",".join([first, *(p for p in parts if p != first)])
        items = list(getattr(namespace, self.dest, None) or [])
        setattr(namespace, self.dest, [*items, value])


class ConfigOrCtx(argparse.Action):
    """``-c``: a number is llama-server's ``--ctx-size``, anything else sluice's
    ``--config``."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        if str(values).isdigit():
            namespace.ctx_size = int(values)
        else:
            namespace.config = values


def add_llama_server_flags(p: argparse.ArgumentParser) -> None:
    """llama-server's (and vLLM's) flag names where they mean the same thing; the ones whose
    meaning sluice has not are refused by name."""
    p.add_argument("model_files", nargs="*", metavar="PATH.gguf",
                   help="serve these GGUF files, or every GGUF in a folder (instead of the "
                        "config's models)")
    p.add_argument("-m", "--model", action="append", metavar="PATH.gguf",
                   help="a GGUF file to serve (llama-server's -m; repeatable)")
    p.add_argument("--alias", "--served-model-name", action=_Names, metavar="NAME[,NAME]",
                   help="the names clients use, one per file in order (default: the "
                        "file's name), more after commas: the model id is the "
                        "alphabetically first --alias name (as llama-server has it) or the "
                        "first --served-model-name (as vLLM has it), the others its aliases")
    p.add_argument("--tags", action="append", metavar="TAG[,TAG]",
                   help="labels /v1/models lists with every model (llama-server's --tags)")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="chat answers carry llama-server's __verbose (the rendered prompt) "
                        "unless a request says verbose: false (server.verbose_answers)")
    p.add_argument("--ctx-size", type=int, metavar="N",
                   help="KV cells per model, split over --parallel sequences (0 = the "
                        "model's trained context; default 8192); also -c N")
    p.add_argument("-np", "--parallel", type=int, metavar="N",
                   help="sequences decoded at once per model (default 8)")
    p.add_argument("-t", "--threads", type=int, metavar="N", help="CPU threads per decode")
    p.add_argument("-b", "--batch-size", type=int, metavar="N",
                   help="the most tokens in one llama_decode (default 512)")
    p.add_argument("-ngl", "--n-gpu-layers", "--gpu-layers", type=int, metavar="N",
                   help="layers offloaded to a GPU (for a GPU build of llama.cpp)")
    p.add_argument("--no-repack", action="store_true",
                   help="keep the weights as the file lays them out (llama.cpp's extra "
                        "buffer types off: the extra_bufts option)")
    p.add_argument("--kv-unified", action="store_true",
                   help="one KV pool that every sequence fills (the kv_unified option)")
    p.add_argument("--chat-template", metavar="NAME|TEMPLATE",
                   help="a llama.cpp template name (chatml, llama3, ...), or the template's "
                        "text, rendered as Jinja")
    p.add_argument("--chat-template-file", metavar="PATH", help="a Jinja chat template file")
    p.add_argument("--jinja", action="store_true",
                   help="accepted: chat templates are always rendered as Jinja")
    p.add_argument("-rea", "--reasoning", type=_reasoning, metavar="on|off|auto",
                   help="thinking by default, or not, on every model (what its chat template "
                        "sees as enable_thinking; a request's reasoning_effort or "
                        "chat_template_kwargs.enable_thinking overrides it); auto, the "
                        "default: each model's own (models.reasoning.enabled, else on)")
    p.add_argument("--reasoning-budget", type=int, metavar="N",
                   help="thinking tokens a request gets unless it asks (-1: no limit, the "
                        "default; 0: the end tag at once); models.reasoning.budget_tokens")
    p.add_argument("--reasoning-format", choices=["auto", "deepseek", "none",
                                                   "deepseek-legacy"],
                   help="accepted as auto or deepseek: the thinking comes back apart from "
                        "the answer (reasoning_content); none and deepseek-legacy are refused")
    p.add_argument("--temp", type=float, metavar="T",
                   help="the temperature of requests that send none ([models.sampling], over "
                        "the model file's own, as in llama-server)")
    p.add_argument("--seed", type=int, metavar="N",
                   help="the seed of requests that send none (-1: each request its own)")
    p.add_argument("-n", "--n-predict", type=int, metavar="N",
                   help="the token limit of requests that name none (default_max_tokens; "
                        "-1: until the context is full)")
    p.add_argument("--embedding", "--embeddings", action="store_true",
                   help="every model also embeds, as MODEL:embedding, on /v1/embeddings and "
                        "Ollama's embed routes (generation stays on)")
    p.add_argument("--pooling", choices=["mean", "cls", "last", "none", "rank"],
                   help="how --embedding pools an input's tokens (default: the file's own, "
                        "else mean; rank: the model reranks instead; none is refused)")
    p.add_argument("--reranking", "--rerank", action="store_true",
                   help="every model also reranks, as MODEL:rerank, on /v1/rerank, with its "
                        "file's classifier head (--embedding --pooling rank)")
    p.add_argument("--no-context-shift", action="store_true",
                   help="accepted: sluice never shifts a context (a request that does not "
                        "fit is refused)")
    p.add_argument("--context-shift", action=_Refused,
                   why="sluice does not shift a full context (it would drop the start of "
                       "the conversation); a request whose prompt and max_tokens exceed the "
                       "context is refused with context_length_exceeded")
    p.add_argument("--cont-batching", action="store_true",
                   help="accepted: generative models batch continuously (see --mode)")
    p.add_argument("--metrics", action="store_true",
                   help="accepted: /metrics is always served (see server.metrics_key)")
    p.add_argument("--slots", action="store_true",
                   help="accepted: GET /slots is served unless --no-slots")
    p.add_argument("--no-slots", action="store_true",
                   help="GET /slots and POST /slots/{id} answer 501 "
                        "(server.slots_endpoint = false)")
    p.add_argument("--unknown-model", choices=["refuse", "default"],
                   help="a request naming a model that is not served: refuse it (404, the "
                        "default) or, on a one-model server, serve it with that model as "
                        "llama-server does (server.unknown_model)")
    p.add_argument("--no-ui", "--no-webui", dest="no_ui", action="store_true",
                   help="no chat page at / (server.web_ui = false; 404 there)")
    p.add_argument("--props", action=_Refused,
                   why="sluice does not change its settings at run time (POST /props "
                       "answers 501): set them in the config file")
    p.add_argument("--slot-save-path", metavar="DIR",
                   help="the folder POST /slots/{id}?action=save|restore writes and reads "
                        "a slot's KV in (server.slot_save_path; unset: 501)")
    p.add_argument("--cors-origins", metavar="ORIGIN[,ORIGIN]",
                   help="origins browsers may call from (server.cors_origins; *: any)")
    p.add_argument("--keep-alive", metavar="DURATION",
                   help="unload a model idle this long (Ollama's forms: 300, 5m, 1h; 0: after "
                        "each request; -1: never; default: never for files, 5m for a folder; "
                        "or $SLUICE_KEEP_ALIVE); a request's keep_alive overrides it")
    p.add_argument("--pin", action="append", metavar="NAME",
                   help="keep this model loaded: never unloaded nor evicted (repeatable)")
    p.add_argument("--api-key", action="append", metavar="KEY[,KEY]",
                   help="require this API key (repeatable or comma-separated; or "
                        "$SLUICE_API_KEY)")
