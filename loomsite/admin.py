"""django-axes' attempts page, re-registered so that its action runs on a permission and answers (issue 25).

axes' "Clean up expired attempts" declares no permission, so every staff user who may view the attempts
was offered it, and it deletes rows; it also answered 500 for everyone, since axes computes the cool-off
threshold from `request.axes_attempt_time`, which only its login handler sets. Here it needs the delete
permission of access attempts, and the threshold is taken from now.
"""

from __future__ import annotations

from axes import admin as axes_admin  # registers axes' pages first, whatever the INSTALLED_APPS order
from axes.models import AccessAttempt
from django.contrib import admin
from django.http import HttpRequest

from journal.admin_base import SafeChangeList


class AccessAttemptAdmin(SafeChangeList, axes_admin.AccessAttemptAdmin):
    actions = ["cleanup_expired_attempts"]

    @admin.action(description="Clean up expired attempts", permissions=["delete"])
    def cleanup_expired_attempts(self, request: HttpRequest, queryset) -> None:
        if getattr(request, "axes_attempt_time", None) is None:
            request.axes_attempt_time = None  # axes then counts the cool-off back from now
        count = self.handler.clean_expired_user_attempts(request=request)
        self.message_user(request, f"Cleaned up {count} expired access attempts.")


if admin.site.is_registered(AccessAttempt):
    admin.site.unregister(AccessAttempt)
    admin.site.register(AccessAttempt, AccessAttemptAdmin)
