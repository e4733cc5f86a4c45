"""The runtime layer: what every stage of tiling, cluster and landcover needs from the
machine and the storage it runs on.

One owner each for atomic writes (`atomic`), this machine's cores and GPUs (`machine`), the
device a rank gets (`device`), the rank-environment contract (`rankenv`), storage URLs
(`urls`), fingerprints of inputs (`fingerprint`), waiting for files (`polling`), the
command-line flag a config's field declares (`flags`), the one-line report of JSON text
that does not parse (`jsontext`) and lock files that their holder removes (`lockfile`).
It imports nothing of tiling but itself and `tiling.errors`, never torch, and is cheap to
import: the modules are imported by name (`from tiling.runtime.atomic import ...`).
"""
