from django.db import migrations, models


class Migration(migrations.Migration):
    """Mark a lease handed back by a graceful shutdown, so its takeover does not count as a recovery attempt."""

    dependencies = [
        ('leases', '0008_schedule_timezone'),
    ]

    operations = [
        migrations.AddField(
            model_name='lease',
            name='handed_back',
            field=models.BooleanField(db_default=False, default=False, help_text="Expired by its owner's graceful shutdown at a step boundary: its takeover is no recovery attempt (LOOM_RECOVERY_MAX_ATTEMPTS); any later write of the row clears it."),
        ),
    ]
