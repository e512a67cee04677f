"""Runs over many traces and what they leave for people and CI.

``campaign`` generates, checks and shrinks many traces; ``report`` writes report.html and
summary.md (``templates/``), ``junit`` the JUnit XML; ``repro`` writes standalone reproductions;
``diff`` / ``diff_machine`` compare two builds' behaviour. May import every other part of
``schedconf.conformance`` except the engine drivers.
"""
