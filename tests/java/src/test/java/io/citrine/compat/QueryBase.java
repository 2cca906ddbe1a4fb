/*
 * What the query tests share: records of the test's own set with an
 * integer, a string, a list and a GeoJSON bin (and the user key stored),
 * a statement over that set, and the sorted values a record set returns.
 */
package io.citrine.compat;

import com.aerospike.client.Bin;
import com.aerospike.client.policy.WritePolicy;
import com.aerospike.client.query.RecordSet;
import com.aerospike.client.query.Statement;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;

abstract class QueryBase extends CompatBase {

    void writeRecords(int n) {
        WritePolicy wp = new WritePolicy();
        wp.sendKey = true;
        for (int i = 0; i < n; i++) {
            client.put(wp, key(i),
                new Bin("i", i),
                new Bin("name", "n" + (i % 10)),
                new Bin("tags", Arrays.asList((long) i % 3, (long) i % 5)),
                Bin.asGeoJSON("loc", String.format(
                    "{\"type\":\"Point\",\"coordinates\":[%f,%f]}", -122.0 + i * 0.001, 37.0)));
        }
    }

    Statement statement() {
        Statement stmt = new Statement();
        stmt.setNamespace(NS);
        stmt.setSetName(set);
        return stmt;
    }

    static List<Long> values(RecordSet rs, String bin) {
        List<Long> out = new ArrayList<>();
        try (rs) {
            while (rs.next()) {
                out.add(rs.getRecord().getLong(bin));
            }
        }
        out.sort(null);
        return out;
    }

    static List<Long> range(long from, long to, long step) {
        List<Long> out = new ArrayList<>();
        for (long v = from; v < to; v += step) {
            out.add(v);
        }
        return out;
    }
}
