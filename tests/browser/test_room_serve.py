"""``app.py --room`` as a teacher starts it (on 127.0.0.1 here: tests talk to loopback only): a login
with the passwords it prints, the teacher's rights and a student's; and ``app.py`` without flags,
unchanged: no login."""

from __future__ import annotations

import re

import pytest
from gradio_client import Client
from gradio_client.exceptions import AppError, AuthenticationError

from thinkviz.bench.browser import app_process

pytestmark = [pytest.mark.browser, pytest.mark.slow]

LOGIN_RE = re.compile(r"(teacher|student): user '([^']+)', password '([^']+)'")


def test_app_room_requires_the_printed_logins_and_tells_teacher_from_student(tiny_folder, tmp_path):
    log = tmp_path / "app.log"
    args = ["--model", tiny_folder, "--quant", "none", "--room", "--cap", "32"]
    with app_process(args, log=log) as (url, _):
        logins = {role: (user, password) for role, user, password in LOGIN_RE.findall(log.read_text())}
        assert set(logins) == {"teacher", "student"}, log.read_text()
        with pytest.raises(AuthenticationError):
            Client(url, verbose=False)
        student = Client(url, verbose=False, auth=logins["student"])
        teacher = Client(url, verbose=False, auth=logins["teacher"])
        with pytest.raises(AppError, match="This room caps a student's run at 32 tokens × policies"):
            student.predict(run_mode="generate", question="Hi", budget=64, max_new_tokens=40, api_name="/generate")
        with pytest.raises(AppError, match="Only the teacher can load a model"):
            student.predict("embedded", "4bit", api_name="/load_model")
        assert "Pushed to everyone" in teacher.predict("generate_muffins", api_name="/push_preset")
        assert student.predict(api_name="/room_news")[0] == "generate_muffins"


def test_app_without_flags_needs_no_login_and_has_no_room(app_url):
    """The session's ``app.py`` (no flags but its host and port)."""
    endpoints = Client(app_url, verbose=False).view_api(return_format="dict", print_info=False)["named_endpoints"]
    assert "/generate" in endpoints and "/push_preset" not in endpoints and "/room_news" not in endpoints
