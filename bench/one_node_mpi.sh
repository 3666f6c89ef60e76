# Sourced by bench/run_bench.sh and bench/ab.sh: the Open MPI settings of a
# timed `mpirun -np R` on this one host, and `launcher R`, which sets the
# array `launch` to the command prefix that runs ucp with R ranks (empty for
# one rank: ucp runs alone, without mpirun).

# Root allowed: the benchmarks drop the page cache, which needs root.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# One node: shared memory only (ob1 + vader), no UCX device probing (~0.2 s a launch).
export OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_plm=isolated
# Open MPI's session folder (PMIx's shared-memory datastore, written by mpirun
# and the ranks) on tmpfs when there is one: under /tmp on a disk it wrote
# 8.6 MB more per 2-rank run here (getrusage block outputs of an `mpirun -np 2
# ucp reshard`: 935,232 blocks with it in /tmp, 918,312 with it in /dev/shm,
# 918,600 for 1 rank), bytes that are not ucp's.
if [[ -d /dev/shm && -w /dev/shm ]]; then export OMPI_MCA_orte_tmpdir_base=/dev/shm; fi

launcher() {
  launch=()
  if (($1 > 1)); then launch=(mpirun -np "$1" --oversubscribe); fi
}
