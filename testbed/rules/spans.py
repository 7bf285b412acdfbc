"""The names of the spans a worker records (testbed.host.spans writes them): one list, read by the
figures, the predictor and the plots alike."""

COMPUTE_SPANS = ("F", "B", "OPT")
COMM_SPANS = ("SEND_F", "RECV_F", "SEND_B", "RECV_B", "ALLREDUCE")
