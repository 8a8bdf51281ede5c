"""Rewrite runs recorded before the settings allow-list: LOOM_API_TOKENS and other secrets were stored in
clear in BenchRun.settings (and maybe in argv); the same rules as new recordings now apply to them."""

from django.db import migrations


def redact_runs(apps, schema_editor):
    from benchmarks.recording import redacted_command_line, scrub_settings

    BenchRun = apps.get_model("benchmarks", "BenchRun")
    db = schema_editor.connection.alias
    for run in BenchRun.objects.using(db).only("id", "settings", "argv").iterator():
        settings, argv = scrub_settings(run.settings or {}), redacted_command_line(run.argv)
        if settings != run.settings or argv != run.argv:
            BenchRun.objects.using(db).filter(pk=run.pk).update(settings=settings, argv=argv)


class Migration(migrations.Migration):

    dependencies = [
        ("benchmarks", "0001_initial"),
    ]

    operations = [
        migrations.RunPython(redact_runs, migrations.RunPython.noop),
    ]
