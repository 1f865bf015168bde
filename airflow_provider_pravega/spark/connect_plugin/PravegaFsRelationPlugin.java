/*
 * Spark Connect server plugin of airflow-provider-pravega: the Hadoop FileSystem calls the stream-cut
 * export makes to publish its output atomically (see airflow_provider_pravega/spark/export_job.py,
 * OutputLocation). A Spark Connect client has no JVM of its own, so it sends each call as an extension
 * relation; the server runs it with its own Hadoop configuration and answers with one row of JSON.
 *
 * Request: a google.protobuf.Any holding a google.protobuf.StringValue whose value is a JSON object
 * {"pravega_fs": 1, "op": ..., "path"/"src"/"dst"/"recursive"/"text": ..., "nonce": ...}. Anything else
 * is not ours (Optional.empty()). Answer: {"value": ...} or {"error": "<first line of the exception>"}.
 * The call runs while the server plans the relation (once per ExecutePlan); the client sends no plan
 * id and a nonce, so the server's plan cache never answers a call from an earlier one.
 *
 * Built by airflow_provider_pravega.spark.connect_plugin.build_plugin_jar (javac against pyspark's jars).
 */
package airflow_provider_pravega.spark;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.ByteArrayOutputStream;
import java.io.InputStream;
import java.io.OutputStream;
import java.nio.charset.StandardCharsets;
import java.util.Collections;
import java.util.Optional;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan;
import org.apache.spark.sql.classic.SparkSession;
import org.apache.spark.sql.connect.planner.SparkConnectPlanner;
import org.apache.spark.sql.connect.plugin.RelationPlugin;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import org.sparkproject.connect.protobuf.Any;
import org.sparkproject.connect.protobuf.StringValue;

public class PravegaFsRelationPlugin implements RelationPlugin {
  static final String TYPE_URL = "type.googleapis.com/google.protobuf.StringValue";
  static final int VERSION = 1;
  private static final ObjectMapper JSON = new ObjectMapper();
  private static final StructType SCHEMA = new StructType().add("result", DataTypes.StringType, false);

  @Override
  public Optional<LogicalPlan> transform(byte[] relation, SparkConnectPlanner planner) {
    JsonNode request;
    try {
      Any any = Any.parseFrom(relation);
      if (!TYPE_URL.equals(any.getTypeUrl())) {
        return Optional.empty();
      }
      request = JSON.readTree(any.unpack(StringValue.class).getValue());
    } catch (Exception notOurs) {
      return Optional.empty();
    }
    if (request == null || !request.isObject() || !request.has("pravega_fs")) {
      return Optional.empty();
    }
    ObjectNode answer = JSON.createObjectNode();
    try {
      if (request.get("pravega_fs").asInt() != VERSION) {
        throw new IllegalArgumentException("pravega_fs request version " + request.get("pravega_fs").asText()
            + " is not " + VERSION + ": rebuild the plugin jar from the installed provider");
      }
      SparkSession session = planner.session();
      run(request, session.sessionState().newHadoopConf(), answer);
    } catch (Exception e) {
      String text = e.toString();
      int eol = text.indexOf('\n');
      answer.removeAll();
      answer.put("error", eol < 0 ? text : text.substring(0, eol));
    }
    Row row = RowFactory.create(answer.toString());
    return Optional.of(planner.session().createDataFrame(Collections.singletonList(row), SCHEMA).logicalPlan());
  }

  private static String text(JsonNode request, String field) {
    JsonNode node = request.get(field);
    if (node == null || !node.isTextual()) {
      throw new IllegalArgumentException("pravega_fs request lacks the text field " + field);
    }
    return node.asText();
  }

  private static void run(JsonNode request, Configuration conf, ObjectNode answer) throws Exception {
    String op = text(request, "op");
    if (op.equals("ping")) {
      answer.put("value", VERSION);
      return;
    }
    if (op.equals("rename")) {
      Path src = new Path(text(request, "src"));
      Path dst = new Path(text(request, "dst"));
      answer.put("value", src.getFileSystem(conf).rename(src, dst));
      return;
    }
    Path path = new Path(text(request, "path"));
    FileSystem fs = path.getFileSystem(conf);
    switch (op) {
      case "resolve": {
        Path parent = path.getParent();
        ObjectNode value = answer.putObject("value");
        value.put("path", path.toString());
        value.put("parent", parent == null ? null : parent.toString());
        value.put("name", path.getName());
        value.put("scheme", fs.getScheme());
        break;
      }
      case "exists":
        answer.put("value", fs.exists(path));
        break;
      case "is_dir":
        answer.put("value", fs.getFileStatus(path).isDirectory());
        break;
      case "mkdirs":
        answer.put("value", fs.mkdirs(path));
        break;
      case "create":
        fs.create(path, true).close();
        answer.put("value", true);
        break;
      case "list": {
        ArrayNode names = answer.putArray("value");
        for (FileStatus status : fs.listStatus(path)) {
          names.add(status.getPath().getName());
        }
        break;
      }
      case "delete":
        answer.put("value", fs.delete(path, request.path("recursive").asBoolean(false)));
        break;
      case "read": {
        ByteArrayOutputStream buffer = new ByteArrayOutputStream();
        try (InputStream in = fs.open(path)) {
          in.transferTo(buffer);
        }
        answer.put("value", new String(buffer.toByteArray(), StandardCharsets.UTF_8));
        break;
      }
      case "write":
        try (OutputStream out = fs.create(path, true)) {
          out.write(text(request, "text").getBytes(StandardCharsets.UTF_8));
        }
        answer.put("value", true);
        break;
      default:
        throw new IllegalArgumentException("unknown pravega_fs op " + op);
    }
  }
}
