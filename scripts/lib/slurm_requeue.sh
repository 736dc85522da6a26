# Stop before the time limit and requeue: the part the batch scripts share (mlmt-configs/submit_mlmt.sbatch,
# mlmt-configs/submit_eval.sbatch, recipes/submit_compare.sbatch); sourced, not run.
#
#   source scripts/lib/slurm_requeue.sh
#   stop_on_request          # from here Slurm's warning (SIGUSR1, --signal=B:USR1@S) and SIGTERM (preemption) are a
#                            # stop request, passed on to the program as SIGUSR1
#   PROGRAM ARGS ... &
#   wait_for_program $!      # passes on a request that came before the program ran, waits until it exits
#   requeue_if_stopped PREFIX WHAT_75_MEANS WHAT_A_SIGNALS_END_MEANS [CLEANUP]   # requeues and exits 0, or exits
#                            # with the program's status
#
# The program stops on SIGUSR1: the trainer and compare finish what they must (a step and its checkpoint) and exit 75
# (EX_TEMPFAIL); a program without a handler for it (the evaluator, or the trainer while it still imports) is ended by
# it, 128 + 10 = 138 (143 after SIGTERM). Either way it continues where it stopped when run again, so the job is
# requeued (`scontrol requeue`, needs --requeue): on 75, and on 138 or 143 after a stop request. Any other status is
# the job's. The job's later starts run the same command; the program resumes (the trainer from its checkpoint, the
# evaluator skips the problems it has done, compare skips what is trained and evaluated).

program_pid=
stop_requested=0
# Slurm's warning (USR1) or preemption (TERM): ask the program to stop (a request that comes before the program runs is
# passed on as soon as it does; the trainer and compare ignore a repeated one).
request_stop() { stop_requested=1; [ -z "$program_pid" ] || kill -USR1 "$program_pid" 2>/dev/null || true; }
stop_on_request() { trap request_stop USR1 TERM; }

# Wait for the program (its PID, started in the background); its exit status in program_status.
wait_for_program() {
  program_pid=$1
  [ "$stop_requested" -eq 0 ] || request_stop
  while kill -0 "$program_pid" 2>/dev/null; do  # `wait` returns early (status > 128) whenever a trapped signal arrives
    wait "$program_pid" || true
  done
  # the program has exited: a second warning or a preemption signal (Slurm's own and `scancel --signal=USR1`, say)
  # has nothing left to stop and must not kill this script before it requeues the job (the default action of USR1 does)
  trap '' USR1 TERM
  # its own exit status (bash keeps it): a signal that cut the last `wait` short gave 128 + its number instead, and a
  # program that stopped with a checkpoint (75) at that moment was then not requeued (the job failed with 138)
  program_status=0
  wait "$program_pid" || program_status=$?
}

# Requeue the job when the program stopped on request ($2 names exit 75, $3 an end by the request's signal, each
# followed by the detail in parentheses), after running the function $4 (optional); else exit with its status.
requeue_if_stopped() {
  local prefix=$1 stopped=$2 ended=$3 cleanup=${4:-} requeue=
  if [ "$program_status" -eq 75 ]; then  # the program stopped on request and can continue: run the rest later
    requeue="$stopped (stop requested: $stop_requested)"
  elif [ "$stop_requested" -eq 1 ] && { [ "$program_status" -eq 138 ] || [ "$program_status" -eq 143 ]; }; then
    # the stop request reached a program without a handler for it (or one still importing, its handler not yet
    # installed), whose default action ended it (128 + USR1 or TERM): it resumes from what it had saved
    requeue="$ended (exit $program_status)"
  fi
  if [ -n "$requeue" ]; then
    echo "$prefix: $requeue; requeue"
    [ -z "$cleanup" ] || "$cleanup"
    scontrol requeue "$SLURM_JOB_ID"
    exit 0
  fi
  exit "$program_status"
}
