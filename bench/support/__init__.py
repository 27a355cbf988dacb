"""What the benches share, not benches themselves: the verdict every summary line carries (verdict.py), py-spy
profiles of a Sluice process (profiling.py), another revision's code beside this checkout (revision.py), generated
access logs (gen_logs.py, also the analytics tests'). ``python -m bench`` runs every module of bench/ itself, and
none of these."""
