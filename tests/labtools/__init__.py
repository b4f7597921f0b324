"""What the lab-driven tests and scripts share, outside the product: the fault storm
(`storm`, test_storm.py and scripts/soak.py), the wire counters (`wire`,
test_image_forward.py and scripts/bench_scale.py) and a cheap image to push (`filler`,
the push's tests and scripts/bench_push.py). Scripts put the repository root on sys.path
to import it."""
