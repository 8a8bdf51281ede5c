"""`manage.py loom_settings`: every LOOM_* setting with its type, default and current value.

The settings are those the installed apps registered (journal/conf.py's registry); `--markdown`
prints them grouped by the app that owns them, as docs/configuration.md carries them.

Secret-looking settings (LOOM_API_TOKENS...) are printed as "<redacted>": the output ends up in
terminals, CI logs and bug reports (journal/redaction.py decides what is secret).
"""

from django.core.management.base import BaseCommand

from journal import conf
from journal.redaction import shown


def markdown_table() -> str:
    """One section per app (in registration order), each a table of the settings it owns."""
    lines: list[str] = []
    for app, items in conf.by_app().items():
        if lines:
            lines.append("")
        lines += [f"### {app} (`{app}/conf.py`)", "", "| setting | type | default | meaning |", "|---|---|---|---|"]
        for item in items:
            default = "unset" if item.default is None else repr(item.default)
            extra = f" One of: {', '.join(item.choices)}." if item.choices else ""
            lines.append(f"| `{item.name}` | {item.type.__name__} | `{default}` | {item.doc}{extra} |")
    return "\n".join(lines) + "\n"


class Command(BaseCommand):
    help = "List the LOOM_* settings: type, default, current value (or --markdown for docs/configuration.md)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--markdown", action="store_true", help="Print the documentation table.")

    def handle(self, *args, markdown: bool = False, **options) -> None:
        if markdown:
            self.stdout.write(markdown_table(), ending="")
            return
        for item in conf.SETTINGS.values():
            value = shown(item.name, conf.get_safe(item.name, "<invalid>"))
            self.stdout.write(f"{item.name} = {value!r}")
