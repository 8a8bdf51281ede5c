"""`manage.py loom_settings`: every LOOM_* setting with its type, default and current value.

Secret-looking settings (LOOM_API_TOKENS...) are printed as "<redacted>": the output ends up in
terminals, CI logs and bug reports (journal/redaction.py decides what is secret).
"""

from django.core.management.base import BaseCommand

from journal import conf
from journal.redaction import shown


def markdown_table() -> str:
    lines = ["| setting | type | default | meaning |", "|---|---|---|---|"]
    for item in conf.SETTINGS.values():
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
