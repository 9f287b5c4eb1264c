"""`raybench` command line. Subcommands live beside the stage they drive and load lazily."""

from __future__ import annotations

import importlib
import re

import click
import yaml

from raybench import __version__
from raybench.core.errors import USER_EXIT_CODE, RaybenchError

# command name -> "module:attribute"; each stage owns its commands.
COMMANDS: dict[str, str] = {
    "cohort": "raybench.cohorts.cli:cohort",
    "manifest": "raybench.cohorts.cli:manifest",
    "encode": "raybench.encoders.cli:encode",
    "train": "raybench.sae.cli:train",
    "analyze": "raybench.analysis.cli:analyze",
    "report": "raybench.analysis.cli:report",
    "grid": "raybench.app.pipeline:grid",
    "config": "raybench.app.cli_config:config",
    "submit": "raybench.app.jobs:submit",
    "status": "raybench.app.jobs:status",
    "logs": "raybench.app.jobs:logs",
    "stop": "raybench.app.jobs:stop",
    "cluster": "raybench.app.cluster_cli:cluster",
    "export": "raybench.app.export_cli:export",
    "features": "raybench.analysis.features.cli:features",
    "checkpoint": "raybench.encoders.checkpoint_cli:checkpoint",
    "provenance": "raybench.analysis.cli:provenance",
    "reliability": "raybench.analysis.cli:reliability",
    "compare": "raybench.analysis.compare.cli:compare",
}


class LazyGroup(click.Group):
    """Imports a subcommand's module only when it is listed or run, so `raybench --help` is fast."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(COMMANDS))

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in COMMANDS:
            module_name, attr = COMMANDS[name].split(":")
            try:
                module = importlib.import_module(module_name)
            except ModuleNotFoundError as err:
                if err.name != module_name:
                    raise
                return None
            return getattr(module, attr)
        return super().get_command(ctx, name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """Each command with the whole first sentence of its help, wrapped, never cut mid-phrase (click's default
        cuts it at ~45 characters)."""
        rows = []
        for name in self.list_commands(ctx):
            cmd = self.get_command(ctx, name)
            if cmd is not None and not cmd.hidden:
                rows.append((name, first_sentence(cmd.help or cmd.short_help or "")))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def invoke(self, ctx: click.Context):
        """User errors (bad config, cohort, manifest, checkpoint, run folder) become one `Error: ...` line and
        exit code 2; `raybench --verbose ...` keeps the traceback."""
        try:
            return super().invoke(ctx)
        except (RaybenchError, yaml.YAMLError) as err:
            if ctx.params.get("verbose"):
                raise
            raise UserError(_one_line(err)) from None
        except click.ClickException as err:  # a stage command that already turned a user error into a message
            if isinstance(err.__context__, RaybenchError | yaml.YAMLError) and err.exit_code == 1:
                err.exit_code = USER_EXIT_CODE
            raise


def first_sentence(text: str) -> str:
    """The help's first sentence (up to a full stop followed by a space or the end of the paragraph)."""
    para = " ".join(text.split("\n\n")[0].split())
    end = re.search(r"(?<!e\.g)(?<!i\.e)\.(\s|$)", para)
    return para[:end.start() + 1] if end else para


class UserError(click.ClickException):
    exit_code = USER_EXIT_CODE


def _one_line(err: BaseException) -> str:
    """The error as one line; the `--verbose` hint only where the traceback shows more than the message does."""
    text = " ".join(str(err).split()) or type(err).__name__
    if isinstance(err, yaml.YAMLError):
        return f"malformed YAML: {text}"
    return f"{text} (run `raybench --verbose ...` for the traceback)" if traceback_helps(err) else text


def traceback_helps(err: BaseException) -> bool:
    """Whether `err` wraps a lower-level exception (a torch load, a parquet read, a connection): its traceback
    then says what the message cannot. A plain user error (a key typo, a missing file) already names the fix."""
    cause = err.__cause__ or (None if err.__suppress_context__ else err.__context__)
    return cause is not None and not isinstance(cause, RaybenchError | yaml.YAMLError)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="raybench")
@click.option("--verbose", "-v", is_flag=True,
              help="Show Ray's own log lines (Ray, Ray Data, Tune) and the full traceback of an error.")
def main(verbose: bool) -> None:
    """raybench: the ECG-InterpBench SAE audit of frozen ECG foundation models, as one Ray job.

    Run `raybench grid` for the embedded demo (synthetic cohort, demo encoders, local Ray).
    """
    from raybench.infra.ray_session import set_verbose

    set_verbose(verbose)


if __name__ == "__main__":
    main()
