import sys

from airflow_provider_pravega.spark.connect_plugin import main

sys.exit(main())
