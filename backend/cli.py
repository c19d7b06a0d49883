"""`python -m backend <command>`: the project's commands, one argparse parser with a subcommand each.

Every command's options are declared here; the work is done by a plain function of the command's module,
called with the configuration, which is read once, here, the same way for every command:
backend.config.load_config (config/backend.yaml, or ERNIE_CONFIG, or --config; ERNIE_* overrides).
`--help` reads nothing and starts nothing.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from backend.accounts.login import add_user_command
from backend.accounts.users import ROLES
from backend.api.commands import api_key_command, link_account_command
from backend.benchmarks.chat_workload import ChatShape
from backend.benchmarks.loadtest import CHATS, loadtest_command
from backend.benchmarks.plan import MIN_REQUESTS
from backend.benchmarks.redact import KEY_ENV
from backend.benchmarks.report import report_command
from backend.benchmarks.run import bench_command
from backend.benchmarks.snapshot import snapshot_command
from backend.benchmarks.workload import DEFAULT_PROMPT_SET
from backend.config import APP_PORT, AppConfig, load_config, print_config
from backend.engines.base import Api, engine_python
from backend.engines.registry import GENERIC_API, build_prebuilt, gguf_quantizer, prebuilt_engine
from backend.errors import ConfigError
from backend.logs import plain_messages, setup_logging
from backend.models.gguf import QUANTS, convert_gguf_command
from backend.models.resolve import prepare_model_command
from backend.ops.doctor import doctor_command
from backend.prompts.store import check_folder
from backend.serving.answers.command import check_answers_command
from backend.serving.answers.tolerance import TOLERANCES
from backend.serving.hardware import detect_gpus
from backend.serving.kept import stop_command
from backend.serving.preflight import check_flags_command
from backend.serving.profiles import choose_profile, effective_flags
from backend.tuning.tuner import tune_command

PROG = "python -m backend"
Command = Callable[[AppConfig, argparse.Namespace], int]


# ----- what each command does with its options -------------------------------------------------------
def _check_prompts(cfg: AppConfig, args: argparse.Namespace) -> int:
    return check_folder(args.folder or cfg.paths.resolve(cfg.paths.prompts_dir))


def _check_config(cfg: AppConfig, args: argparse.Namespace) -> int:
    return print_config(cfg)


def _loadtest(cfg: AppConfig, args: argparse.Namespace) -> int:
    url = args.url or cfg.app.url
    out = Path(args.out)
    return loadtest_command(
        url, args.sessions, args.duration, args.max_tokens, args.app_pid, out, args.chats, args.api_clients
    )


def _session_counts(text: str) -> list[int]:
    """ "1,16,1,16": session counts, run in that order."""
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"session counts separated by commas (1,16), not {text!r}") from None
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"session counts of at least 1, not {text!r}")
    return counts


def _chat_kinds(text: str) -> list[str]:
    """ "fresh,growing": the kinds of chat, run in that order."""
    kinds = [part.strip() for part in text.split(",") if part.strip()]
    if not kinds or any(kind not in CHATS for kind in kinds):
        raise argparse.ArgumentTypeError(f"kinds of chat among {', '.join(CHATS)}, not {text!r}")
    return kinds


def _prepare_model(cfg: AppConfig, args: argparse.Namespace) -> int:
    return prepare_model_command(cfg, engine_python(cfg))


def _stop_engine(cfg: AppConfig, args: argparse.Namespace) -> int:
    return stop_command(cfg)


def _tune(cfg: AppConfig, args: argparse.Namespace) -> int:
    return tune_command(cfg, force=args.force, users=args.users)


def _check_flags(cfg: AppConfig, args: argparse.Namespace) -> int:
    return check_flags_command(cfg, list_only=args.list, all_profiles=args.all_profiles)


def _build_trt_engine(cfg: AppConfig, args: argparse.Namespace) -> int:
    gpus = detect_gpus()
    flags = effective_flags(cfg, choose_profile(cfg, prebuilt_engine(), gpus))  # the profile sizes the engine
    smallest_cc = min((gpu.compute_capability or (0, 0) for gpu in gpus), default=None)  # picks the dtype
    return build_prebuilt(cfg, engine_python(cfg), flags, smallest_cc)


def _bench(cfg: AppConfig, args: argparse.Namespace) -> int:
    if args.snapshot:
        return snapshot_command(cfg, args, args.argv, engine_python(cfg))
    return bench_command(cfg, args, args.argv, engine_python(cfg))


def _doctor(cfg: AppConfig, args: argparse.Namespace) -> int:
    return doctor_command(
        cfg,
        app_url=args.app_url,
        engine_url=args.engine_url,
        log=args.log,
        no_app=args.no_app,
        whole_log=args.all_log,
        strict=args.strict,
        timeout_s=args.timeout,
    )


def _report(cfg: AppConfig, args: argparse.Namespace) -> int:
    return report_command(args.results)


def _check_answers(cfg: AppConfig, args: argparse.Namespace) -> int:
    url = args.url or cfg.server.base_url or f"http://{cfg.server.host}:{cfg.server.port}"
    return check_answers_command(url, args.key, args.name or cfg.model.served_name, args.api, args.reference,
                                 args.format, args.timeout)  # fmt: skip


def _convert_gguf(cfg: AppConfig, args: argparse.Namespace) -> int:
    return convert_gguf_command(cfg, engine_python(cfg), gguf_quantizer(cfg), args.source, args.quant)


def _link_account(cfg: AppConfig, args: argparse.Namespace) -> int:
    return link_account_command(cfg, args.name, args.email)


def _add_user(cfg: AppConfig, args: argparse.Namespace) -> int:
    return add_user_command(
        cfg, args.name, file=args.file, password_stdin=args.password_stdin, print_only=args.print_only, role=args.role
    )


def _api_key(cfg: AppConfig, args: argparse.Namespace) -> int:
    return api_key_command(cfg, args.action, getattr(args, "user", None), getattr(args, "name", None),
                           getattr(args, "key_id", None))  # fmt: skip


# ----- the parser ------------------------------------------------------------------------------------
def _messages(level: int) -> Callable[[], None]:
    """Log setup of the commands that show progress as plain log lines."""
    return lambda: plain_messages(level)


def _no_logging() -> None:
    """Commands that print their own output set up no logging (Python's default: warnings on stderr)."""


def _bench_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--name", help="results folder name under results/ (default: bench-<date>-<time>)")
    p.add_argument("--out-dir", type=Path, help="results folder (default: results/<name>)")
    p.add_argument("--port", type=int, default=0, help="port of the managed engine (default 0: a free one)")
    p.add_argument("--base-url", help="measure this running OpenAI-compatible server instead (http://host:port[/v1])")
    p.add_argument(
        "--api-key",
        metavar="KEY",
        help=f"its API key (default: ${KEY_ENV}, else EMPTY); the environment keeps it out of ps, "
        "and the recorded command shows it as ***",
    )
    p.add_argument("--model", help="its model name (default: the first of /v1/models)")
    p.add_argument("--concurrency", default="1,2,4,8", help="comma-separated levels (default 1,2,4,8)")
    p.add_argument(
        "--repeat",
        type=int,
        default=3,
        metavar="N",
        help="rounds: each level and target measured N times, alternated (default 3)",
    )
    p.add_argument(
        "--per-user",
        type=int,
        default=4,
        metavar="N",
        help=f"requests per level and round = N x concurrency, at least {MIN_REQUESTS} (default 4)",
    )
    p.add_argument(
        "--requests", type=int, metavar="N", help="fixed number of requests per level and round instead of --per-user"
    )
    p.add_argument("--rounds", type=int, help=argparse.SUPPRESS)  # renamed: a clear error in check_options
    shape = ChatShape()
    p.add_argument(
        "--workload",
        choices=("requests", "chat"),
        default="requests",
        help="requests: independent requests of --datasets (default); chat: conversations whose history grows, "
        f"--concurrency users at once, --per-user/--requests turns per level (at least {MIN_REQUESTS}), "
        "plain HTTP only",
    )
    p.add_argument(
        "--turns", type=int, default=shape.turns, help=f"chat: turns per conversation (default {shape.turns})"
    )
    p.add_argument(
        "--message-tokens",
        default="-".join(map(str, shape.message_tokens)),
        metavar="LOW-HIGH",
        help="chat: new user message length in tokens, approximate (default %(default)s)",
    )
    p.add_argument(
        "--reply-tokens",
        default="-".join(map(str, shape.reply_tokens)),
        metavar="LOW-HIGH",
        help="chat: reply length in tokens, exact (ignore_eos; default %(default)s)",
    )
    p.add_argument(
        "--pin-slots",
        type=int,
        default=0,
        metavar="N",
        help="chat, llama-server: send conversation i to slot i %% N (id_slot); 0 (default): the server chooses",
    )
    p.add_argument("--datasets", default="synthetic,prompts", help="synthetic and/or prompts (default both)")
    p.add_argument("--input-len", type=int, default=256, help="synthetic prompt tokens, template included")
    p.add_argument("--output-len", type=int, default=128, help="synthetic output tokens")
    p.add_argument("--prompts", type=Path, default=DEFAULT_PROMPT_SET, help="prompt set (JSONL)")
    p.add_argument("--prompts-output-len", type=int, help="output tokens for every prompt-set request")
    p.add_argument("--no-ignore-eos", action="store_true", help="let replies end at EOS (lengths then vary)")
    p.add_argument("--temperature", type=float, help="default: chat.temperature of the configuration")
    p.add_argument("--top-p", type=float, help="default: chat.top_p of the configuration")
    p.add_argument(
        "--app-concurrency",
        default="ends",
        help="levels also run through the app's client: 'ends' (lowest and highest), a list, or 'none'",
    )
    p.add_argument("--no-baseline", action="store_true", help="skip the HF transformers baseline")
    p.add_argument("--hf-model", help="model folder for the HF baseline (default: the managed engine's)")
    p.add_argument("--hf-python", help="interpreter with torch+transformers (default: the engine's)")
    p.add_argument("--hf-cache", choices=("static", "dynamic"), default="static", help="HF KV cache (default static)")
    p.add_argument("--hf-dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16")
    p.add_argument("--hf-threads", type=int, help="torch threads for the baseline (default: torch's own)")
    p.add_argument(
        "--client-processes",
        type=int,
        default=1,
        metavar="N",
        help="send each plain-HTTP level from N client processes (users split among them), so one Python client's "
        "own loop is not what is measured at many users; for a server on other cores (a GPU's), not a 2-core CPU "
        "(default 1)",
    )
    p.add_argument("--warmup", type=int, default=2, help="unmeasured requests before the sweep (default 2)")
    p.add_argument("--timeout", type=float, default=600.0, help="longest wait per request in seconds")
    p.add_argument(
        "--seed", type=int, default=ChatShape().seed, help="draws the synthetic prompts and the chat conversations"
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument(
        "--snapshot",
        action="store_true",
        help="the daily baseline: the running app's engine, a short fixed workload, one line added to "
        "<data_dir>/bench-history.jsonl (the workload options above are ignored)",
    )


def _doctor_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--app-url", help=f"the app's address (default http://127.0.0.1:<app.port>, {APP_PORT} as make run)")
    p.add_argument("--no-app", action="store_true", help="do not check the app")
    p.add_argument("--engine-url", help="the engine's address (default: from <data_dir>/engine.json)")
    p.add_argument("--log", help="the engine log (default: from engine.json, else <data_dir>/logs/engine.log)")
    p.add_argument("--all-log", action="store_true", help="scan the whole log, not only the latest start")
    p.add_argument("--strict", action="store_true", help="exit 1 on warnings too")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds per HTTP check")


def _formatter(prog: str) -> argparse.HelpFormatter:
    """argparse's layout, 100-120 columns wide: most help lines fit on one line."""
    width = min(120, max(100, shutil.get_terminal_size().columns))
    return argparse.HelpFormatter(prog, max_help_position=30, width=width)


def build_parser() -> argparse.ArgumentParser:
    """The parser of `python -m backend`: one subparser per command, each with its help line and options."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        formatter_class=_formatter,
        description="Commands of the ERNIE chat service.",
        epilog=f"`{PROG} <command> --help` shows a command's options. Every command reads config/backend.yaml "
        "(or ERNIE_CONFIG, or its --config FILE) with the ERNIE_<SECTION>__<KEY> overrides.",
    )
    commands = parser.add_subparsers(title="commands", dest="command", metavar="<command>")
    shared = argparse.ArgumentParser(add_help=False)
    shared.add_argument(
        "--config", metavar="FILE", help="configuration file (default: ERNIE_CONFIG, else config/backend.yaml)"
    )

    def command(
        name: str, run: Command, text: str, setup_log: Callable[[], None] = _no_logging
    ) -> argparse.ArgumentParser:
        sub = commands.add_parser(
            name, help=text, description=text[0].upper() + text[1:] + ".", parents=[shared], formatter_class=_formatter
        )
        sub.set_defaults(run=run, setup_log=setup_log)
        return sub

    p = command("check-prompts", _check_prompts, "validate the prompt templates folder (exit 1 on problems)")
    p.add_argument("folder", nargs="?", help="folder of template files (default: paths.prompts_dir, prompts)")

    p = command("check-config", _check_config, "validate config/backend.yaml and ERNIE_* overrides; print the result")
    p.add_argument("config_file", nargs="?", metavar="CONFIG", help="the file to check (same as --config)")

    p = command("loadtest", _loadtest, "many chat sessions at once through the app's websocket")
    p.add_argument("--url", help=f"the app's address (default http://127.0.0.1:<app.port>, {APP_PORT} as make run)")
    p.add_argument("--sessions", type=_session_counts, default=[64], help="session counts, each a run: 1,16")
    p.add_argument(
        "--chats",
        type=_chat_kinds,
        default=["growing"],
        help="fresh (each message in a new chat), growing (one chat per session), or both: fresh,growing",
    )
    p.add_argument("--duration", type=float, default=120, help="seconds to keep sending, per run")
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--app-pid", type=int, help="the app's pid, to sample memory")
    p.add_argument("--api-clients", type=int, default=0, help="tools calling the app's API at the same time")
    p.add_argument("--out", default="results/load")

    command(
        "prepare-model",
        _prepare_model,
        "resolve the model now (converts the offline demo model once)",
        _messages(logging.INFO),
    )

    command(
        "stop-engine",
        _stop_engine,
        "stop the engine that engine.keep_running left running after the app (stop the app first)",
        _messages(logging.INFO),
    )

    p = command(
        "tune",
        _tune,
        "choose the fastest CPU engine and format by measuring them on this machine (kept; the app's first start "
        "runs it too)",
        _messages(logging.INFO),
    )
    p.add_argument("--force", action="store_true", help="measure again even if a result for this machine is kept")
    p.add_argument("--users", type=int, help="chats expected at once (default: tune.users)")

    p = command(
        "check-flags",
        _check_flags,
        "check engine flags against the installed engine's own parser",
        _messages(logging.WARNING),
    )
    p.add_argument("--list", action="store_true", help="print the flags the installed engine accepts")
    p.add_argument("--all-profiles", action="store_true", help="check every profile, not only the detected one")

    p = command(
        "build-trt-engine",
        _build_trt_engine,
        "build the TensorRT-LLM engine for trtllm.backend: tensorrt",
        _messages(logging.INFO),
    )
    p.add_argument("config_file", nargs="?", metavar="CONFIG", help="configuration file (same as --config)")

    p = command(
        "bench",
        _bench,
        "benchmark latency/throughput against concurrency, HF baseline, app overhead",
        setup_logging,
    )
    _bench_options(p)

    p = command("report", _report, "rewrite a benchmark's report.md and plots from its results.json")
    p.add_argument("results", type=Path, help="a results.json written by bench")

    p = command(
        "check-answers",
        _check_answers,
        "compare a running engine's log-probabilities with a float32 reference (the answer check)",
        _messages(logging.INFO),
    )
    p.add_argument("reference", type=Path, help="a JSON file from backend.child.logprob_reference")
    p.add_argument("--url", help="the engine's root URL (default: server.base_url, else server.host:server.port)")
    p.add_argument("--key", default="", help="its API key (default: none)")
    p.add_argument("--name", help="the served model name (default: model.served_name)")
    p.add_argument("--api", type=Api, choices=list(Api), default=GENERIC_API, help="the server's dialect")
    p.add_argument("--format", default="bfloat16", help=f"tolerance preset: {', '.join(TOLERANCES)}")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds for the whole check")

    p = command("doctor", _doctor, "check the app, the engine, its metrics and its log; explain known failures")
    _doctor_options(p)

    p = command(
        "convert-gguf",
        _convert_gguf,
        "convert a model folder to GGUF for llama.cpp now (cached)",
        _messages(logging.INFO),
    )
    p.add_argument("source", nargs="?", type=Path, help="Hugging Face model folder (default: model.id)")
    p.add_argument("--quant", choices=QUANTS, help="quantization (default: llamacpp.quantization)")

    p = command("api-key", _api_key, "make, list and revoke users' API keys; show usage (see docs/api.md)")
    actions = p.add_subparsers(dest="action", metavar="<action>", required=True)
    after = argparse.ArgumentParser(add_help=False)  # --config after the action too, without undoing one before it
    after.add_argument("--config", metavar="FILE", default=argparse.SUPPRESS, help="configuration file")
    a = actions.add_parser(
        "create", parents=[after], help="make a key for USER (printed once)", formatter_class=_formatter
    )
    a.add_argument("user", help="the user the key acts as (with their role)")
    a.add_argument("--name", default="cli", help="what the key is for (shown in lists)")
    a = actions.add_parser(
        "list", parents=[after], help="list keys (of USER), revoked ones too", formatter_class=_formatter
    )
    a.add_argument("user", nargs="?")
    a = actions.add_parser(
        "revoke", parents=[after], help="revoke the key with this id (from list)", formatter_class=_formatter
    )
    a.add_argument("key_id")
    a = actions.add_parser(
        "usage", parents=[after], help="tokens per user, day and route (chat, api)", formatter_class=_formatter
    )
    a.add_argument("user", nargs="?")

    p = command(
        "link-account",
        _link_account,
        "let the organisation's sign-in with a verified email use an existing password account (docs/accounts.md)",
    )
    p.add_argument("name", help="the password account (in the users file)")
    p.add_argument("--email", required=True, help="the email the organisation's provider confirms for its owner")

    p = command("add-user", _add_user, "add a login user or change a password (see docs/accounts.md)")
    p.add_argument("name", help="user name (letters, digits, . _ @ -)")
    p.add_argument("--file", type=Path, help="users file (default: auth.users_file of the configuration)")
    p.add_argument("--password-stdin", action="store_true", help="read the password from stdin (no prompt)")
    p.add_argument(
        "--print", dest="print_only", action="store_true", help="print name:hash for ERNIE_AUTH__USERS, write nothing"
    )
    p.add_argument(
        "--role",
        choices=ROLES,
        help="user: chat only (the default for a new user); editor or admin: may also edit the prompt templates "
        "in the workshop (/workshop). Without it an existing user keeps their role",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the command line, read the configuration once, run the command; return its exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)  # --help and usage errors exit here (0 and 2), before any work
    if args.command is None:
        parser.print_help()
        return 0
    args.argv = argv[argv.index(args.command) + 1 :]  # the command's own arguments, as given
    try:
        cfg = load_config(getattr(args, "config_file", None) or args.config)
    except ConfigError as exc:
        print(f"{PROG} {args.command}: {exc.message}", file=sys.stderr)
        if exc.hint:
            print(exc.hint, file=sys.stderr)
        return 1
    args.setup_log()
    return int(args.run(cfg, args))
