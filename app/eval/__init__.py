"""``switchyard eval``: shipped evaluation sets, their graders, a runner through the
public API and a scored report (``sets``, ``graders``, ``runner``, ``report``)."""
