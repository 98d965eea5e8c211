"""Co-refresh groups: tables of one source archived at common positions (cuts).

`model` (what the configuration says), `manifest` (the group manifest `group.json` and its
compare-and-swap), `plan` (the watermark and each member's step to it), `cut` (one group tick:
build, commit, publish), `read` (a group's members rebuilt at one cut), `jobs` (the Dagster
cut and reconstruct jobs; the sensor is sensors/group_cut.py).
"""
