"""The operators' Scheduling page in the admin: GPU time per user, the fair queue and its waits, and what each
GPU worker trains and holds (training.selectors_ops). Staff only, through the admin's own login."""

from __future__ import annotations

from django.contrib import admin
from django.shortcuts import render

from training.selectors_ops import scheduling_overview


def _scheduling(request):
    context = {**admin.site.each_context(request), "title": "Scheduling", **scheduling_overview()}
    return render(request, "admin/scheduling.html", context)


scheduling_view = admin.site.admin_view(_scheduling)
