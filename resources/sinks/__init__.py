"""Event sinks: where commit notifications go (a local file, SNS, SQS, Kinesis)."""
