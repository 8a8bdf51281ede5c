"""`manage.py bench_privacy`: what sealed fields, forget and the content store cost (docs/privacy.md)."""

from benchmarks.command import BenchCommand
from benchmarks.sections import PRIVACY_SECTIONS


class Command(BenchCommand):
    help = "Measure personal-data handling (encryption, forget, content store) on the configured database."
    sections = PRIVACY_SECTIONS
