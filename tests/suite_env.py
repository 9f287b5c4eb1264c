"""The environment the suite sets for every process and Ray it starts (tests/conftest.py sets it; a test that starts
a Ray where the environment does not travel, such as over sshd, passes the same names on)."""

MATH_THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")  # under xdist only: one each

# Ray's background work that nothing in the suite reads (why each: tests/conftest.py `_quiet_background_ray`)
QUIET_RAY = {"RAY_enable_metrics_collection": "0", "RAY_LOG_MONITOR_MANY_FILES_THRESHOLD": "0",
             "LOG_NAME_UPDATE_INTERVAL_S": "2", "REPORTER_UPDATE_INTERVAL_MS": "60000",
             "RAY_task_events_report_interval_ms": "0", "RAY_event_stats": "0", "AUTOSCALER_UPDATE_INTERVAL_S": "30"}
