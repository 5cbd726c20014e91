// The Kafka client side of scripts/offsets-vs-mm2.sh: writes the source
// topic, runs the consumer groups on the source, waits for the destinations'
// group offsets to settle, consumes each group after the failover and
// compares. Plain Java against Kafka's own client jars (compiled by the
// script with javac; no build tool). Every record's value is a label that
// names it on every cluster: p<partition>-r<round>-<kind><index>, kind `i`
// an idempotent producer's record, `c` a committed transaction's, `a` an
// aborted transaction's.
//
//   Drill create    BOOTSTRAP TOPIC PARTITIONS
//   Drill write     BOOTSTRAP TOPIC PARTITIONS ROUNDS
//   Drill scan      BOOTSTRAP TOPIC OUT
//   Drill groups    BOOTSTRAP TOPIC TRUTH ROUNDS OUTDIR
//   Drill settle    TOPIC TRUTH GROUPS STABLE_S MIN_S TIMEOUT_S NAME=BOOTSTRAP...
//   Drill failover  BOOTSTRAP TOPIC GROUPS OUTDIR SIDE
//   Drill report    TRUTH GROUPS OUTDIR SIDE=TITLE...
//
// GROUPS is a comma-separated list. Files: TRUTH and OUTDIR/<group>.<side>
// hold `partition offset label` lines; OUTDIR/<group>.<side>.start the
// group's committed offset per partition on that side before it consumed
// (`partition offset`, or `partition none`).

import java.io.IOException;
import java.io.PrintWriter;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collection;
import java.util.HashMap;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.Properties;
import java.util.Set;
import java.util.TreeMap;
import java.util.concurrent.TimeUnit;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

public class Drill {
    static final Duration WAIT = Duration.ofSeconds(120);

    public static void main(String[] args) throws Exception {
        if (args.length == 0) usage();
        String[] rest = Arrays.copyOfRange(args, 1, args.length);
        switch (args[0]) {
            case "create" -> create(rest);
            case "write" -> write(rest);
            case "scan" -> scan(rest);
            case "groups" -> groups(rest);
            case "settle" -> settle(rest);
            case "failover" -> failover(rest);
            case "report" -> report(rest);
            default -> usage();
        }
    }

    static void usage() {
        System.err.println("usage: Drill create|write|scan|groups|settle|failover|report ... (see the top of Drill.java)");
        System.exit(2);
    }

    static void need(String[] a, int n) {
        if (a.length < n) usage();
    }

    // The shape of the source log, the same on every run. Round r holds, in
    // each partition, plain(r, p) records of an idempotent producer, then
    // one transaction of txn(r) records per partition, aborted when r % 4
    // == 2. The runs of plain records reach 260: longer than MirrorMaker
    // 2's offset.lag.max (100).
    static int plain(int r, int p) {
        return 1 + Math.floorMod(r * 97 + p * 31 + 13, 260);
    }

    static int txn(int r) {
        return 1 + Math.floorMod(r * 7 + 3, 12);
    }

    static boolean aborted(int r) {
        return r % 4 == 2;
    }

    static String label(int p, int r, char kind, int i) {
        return "p" + p + "-r" + r + "-" + kind + i;
    }

    static Properties common(String bootstrap) {
        Properties c = new Properties();
        c.put("bootstrap.servers", bootstrap);
        return c;
    }

    // --- write: the source topic ---------------------------------------------

    static void create(String[] a) throws Exception {
        need(a, 3);
        try (Admin admin = Admin.create(common(a[0]))) {
            admin.createTopics(List.of(new NewTopic(a[1], Integer.parseInt(a[2]), (short) 1))).all().get();
        }
    }

    static void write(String[] a) throws Exception {
        need(a, 4);
        String bootstrap = a[0], topic = a[1];
        int partitions = Integer.parseInt(a[2]), rounds = Integer.parseInt(a[3]);
        Properties pc = common(bootstrap);
        pc.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        pc.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        pc.put(ProducerConfig.ACKS_CONFIG, "all");
        pc.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
        pc.put(ProducerConfig.LINGER_MS_CONFIG, "5");
        Properties tc = (Properties) pc.clone();
        tc.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, "drill-writer");
        long plainRecords = 0, committed = 0, abortedRecords = 0;
        try (KafkaProducer<String, String> plainProducer = new KafkaProducer<>(pc);
             KafkaProducer<String, String> txnProducer = new KafkaProducer<>(tc)) {
            txnProducer.initTransactions();
            for (int r = 0; r < rounds; r++) {
                for (int p = 0; p < partitions; p++) {
                    for (int i = 0; i < plain(r, p); i++) {
                        plainProducer.send(new ProducerRecord<>(topic, p, null, label(p, r, 'i', i)));
                        plainRecords++;
                    }
                }
                plainProducer.flush();
                txnProducer.beginTransaction();
                char kind = aborted(r) ? 'a' : 'c';
                for (int p = 0; p < partitions; p++) {
                    for (int i = 0; i < txn(r); i++) {
                        txnProducer.send(new ProducerRecord<>(topic, p, null, label(p, r, kind, i)));
                    }
                }
                // Flushed first, so the aborted records do land in the log
                // (and move the source's offsets) before their marker.
                txnProducer.flush();
                if (aborted(r)) {
                    txnProducer.abortTransaction();
                    abortedRecords += (long) partitions * txn(r);
                } else {
                    txnProducer.commitTransaction();
                    committed += (long) partitions * txn(r);
                }
            }
        }
        System.out.printf("wrote %d idempotent records, %d in committed and %d in aborted transactions (%d rounds, %d partitions)%n",
                plainRecords, committed, abortedRecords, rounds, partitions);
    }

    // --- scan: every committed record with its offset ---------------------------

    static KafkaConsumer<String, String> consumer(String bootstrap, String group, String reset) {
        Properties c = common(bootstrap);
        c.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        c.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        c.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed");
        c.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        c.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, reset);
        if (group != null) c.put(ConsumerConfig.GROUP_ID_CONFIG, group);
        return new KafkaConsumer<>(c);
    }

    static List<TopicPartition> partitionsOf(KafkaConsumer<?, ?> c, String topic) {
        List<TopicPartition> out = new ArrayList<>();
        c.partitionsFor(topic, WAIT).forEach(i -> out.add(new TopicPartition(topic, i.partition())));
        out.sort((x, y) -> Integer.compare(x.partition(), y.partition()));
        return out;
    }

    /** Every record a read_committed consumer sees, per partition, from the start to the end. */
    static TreeMap<Integer, List<Rec>> readAll(String bootstrap, String topic) {
        TreeMap<Integer, List<Rec>> out = new TreeMap<>();
        try (KafkaConsumer<String, String> c = consumer(bootstrap, null, "earliest")) {
            List<TopicPartition> tps = partitionsOf(c, topic);
            c.assign(tps);
            c.seekToBeginning(tps);
            Map<TopicPartition, Long> ends = c.endOffsets(tps, WAIT);
            for (TopicPartition tp : tps) out.put(tp.partition(), new ArrayList<>());
            long deadline = System.nanoTime() + WAIT.toNanos();
            while (!tps.stream().allMatch(tp -> c.position(tp, WAIT) >= ends.get(tp))) {
                if (System.nanoTime() > deadline) throw new IllegalStateException("reading " + topic + " at " + bootstrap + ": timed out");
                for (ConsumerRecord<String, String> rec : c.poll(Duration.ofMillis(200))) {
                    out.get(rec.partition()).add(new Rec(rec.partition(), rec.offset(), rec.value()));
                }
            }
        }
        return out;
    }

    static void scan(String[] a) throws Exception {
        need(a, 3);
        writeRecs(Path.of(a[2]), readAll(a[0], a[1]));
    }

    record Rec(int partition, long offset, String label) {}

    static void writeRecs(Path path, Map<Integer, List<Rec>> recs) throws IOException {
        try (PrintWriter w = new PrintWriter(Files.newBufferedWriter(path))) {
            for (List<Rec> l : recs.values()) for (Rec r : l) w.println(r.partition + " " + r.offset + " " + r.label);
        }
    }

    static TreeMap<Integer, List<Rec>> readRecs(Path path) throws IOException {
        TreeMap<Integer, List<Rec>> out = new TreeMap<>();
        for (String line : Files.readAllLines(path)) {
            if (line.isBlank()) continue;
            String[] f = line.split(" ");
            int p = Integer.parseInt(f[0]);
            out.computeIfAbsent(p, k -> new ArrayList<>()).add(new Rec(p, Long.parseLong(f[1]), f[2]));
        }
        return out;
    }

    // --- groups: consumers on the source, each stopping somewhere else --------

    /** The groups, in the order of the table, and what each shape means. */
    static final LinkedHashMap<String, String> GROUPS = new LinkedHashMap<>();
    static {
        GROUPS.put("drill-early", "after the first records of the log (an old commit)");
        // The coordinator writes a transaction's markers after commitTransaction
        // returns, so a marker lands a little later in the log, often after the
        // next round's first idempotent records: where these commits point
        // (a marker, an aborted record, the next round) varies from run to run.
        GROUPS.put("drill-on-marker", "after a committed transaction's last record (its marker, or the next round's records)");
        GROUPS.put("drill-long-run", "70% into the longest run of idempotent records of the first half (far from any marker)");
        GROUPS.put("drill-after-abort", "after the first idempotent record that follows an aborted transaction");
        GROUPS.put("drill-in-txn", "in the middle of a committed transaction");
        GROUPS.put("drill-before-abort", "after the last record before an aborted transaction (the previous marker or the first aborted record)");
        GROUPS.put("drill-recent", "a few records before the end");
        GROUPS.put("drill-end", "everything: the consumer's position, past the last marker");
    }

    static int indexOf(List<Rec> l, String label) {
        for (int i = 0; i < l.size(); i++) if (l.get(i).label.equals(label)) return i;
        throw new IllegalStateException("no record " + label);
    }

    static int committedRound(int from, int rounds, int minTxn) {
        for (int r = Math.max(0, from); r < rounds; r++) if (!aborted(r) && txn(r) >= minTxn) return r;
        throw new IllegalStateException("no committed round from " + from);
    }

    static int abortedRound(int near, int rounds) {
        for (int r = Math.max(2, near); r < rounds - 1; r++) if (aborted(r)) return r;
        for (int r = Math.min(near, rounds - 2); r >= 2; r--) if (aborted(r)) return r;
        throw new IllegalStateException("no aborted round (ROUNDS too small)");
    }

    /**
     * Index (in the partition's committed records) of the last record the
     * group consumes on the source; -1 for everything (commit the position).
     */
    static int stop(String group, int p, List<Rec> l, int rounds) {
        switch (group) {
            case "drill-early":
                return Math.min(1 + p, l.size() - 1);
            case "drill-on-marker": {
                int r = committedRound(rounds / 4 + p, rounds, 1);
                return indexOf(l, label(p, r, 'c', txn(r) - 1));
            }
            case "drill-long-run": {
                int best = 0;
                for (int r = 0; r < rounds / 2; r++) if (plain(r, p) > plain(best, p)) best = r;
                return indexOf(l, label(p, best, 'i', plain(best, p) * 7 / 10));
            }
            case "drill-after-abort": {
                int r = abortedRound(rounds / 2 - 4 * (p % 2), rounds);
                return indexOf(l, label(p, r + 1, 'i', 0));
            }
            case "drill-in-txn": {
                int r = committedRound(rounds / 2 + p, rounds, 2);
                return indexOf(l, label(p, r, 'c', txn(r) / 2 - 1));
            }
            case "drill-before-abort": {
                int r = abortedRound(3 * rounds / 4 - 4 * (p % 2), rounds);
                return indexOf(l, label(p, r, 'i', plain(r, p) - 1));
            }
            case "drill-recent": {
                int r = rounds - 1;
                return indexOf(l, label(p, r, 'i', Math.max(0, plain(r, p) - 3 - p)));
            }
            case "drill-end":
                return -1;
            default:
                throw new IllegalArgumentException(group);
        }
    }

    static void groups(String[] a) throws Exception {
        need(a, 5);
        String bootstrap = a[0], topic = a[1];
        TreeMap<Integer, List<Rec>> truth = readRecs(Path.of(a[2]));
        int rounds = Integer.parseInt(a[3]);
        Path out = Path.of(a[4]);
        for (String group : GROUPS.keySet()) {
            Map<Integer, Integer> stops = new TreeMap<>();
            for (var e : truth.entrySet()) stops.put(e.getKey(), stop(group, e.getKey(), e.getValue(), rounds));
            consumeAndCommit(bootstrap, topic, group, truth, stops, out.resolve(group + ".source"));
        }
    }

    /** The group's consumer subscribes, consumes each partition up to its stop, and commits. */
    static void consumeAndCommit(String bootstrap, String topic, String group, Map<Integer, List<Rec>> truth,
                                 Map<Integer, Integer> stops, Path out) throws IOException {
        Map<Integer, List<Rec>> consumed = new TreeMap<>();
        Map<TopicPartition, OffsetAndMetadata> commit = new HashMap<>();
        try (KafkaConsumer<String, String> c = consumer(bootstrap, group, "earliest")) {
            c.subscribe(List.of(topic));
            Set<TopicPartition> done = new HashSet<>();
            long deadline = System.nanoTime() + WAIT.toNanos();
            Map<TopicPartition, Long> ends = null;
            while (done.size() < truth.size()) {
                if (System.nanoTime() > deadline) throw new IllegalStateException(group + ": timed out consuming");
                for (ConsumerRecord<String, String> rec : c.poll(Duration.ofMillis(200))) {
                    TopicPartition tp = new TopicPartition(rec.topic(), rec.partition());
                    if (done.contains(tp)) continue;
                    List<Rec> l = consumed.computeIfAbsent(rec.partition(), k -> new ArrayList<>());
                    l.add(new Rec(rec.partition(), rec.offset(), rec.value()));
                    int s = stops.get(rec.partition());
                    if (s >= 0 && l.size() == s + 1) {
                        if (!rec.value().equals(truth.get(rec.partition()).get(s).label))
                            throw new IllegalStateException(group + ": consumed " + rec.value() + " as record " + s);
                        commit.put(tp, new OffsetAndMetadata(rec.offset() + 1));
                        done.add(tp);
                        c.pause(List.of(tp));
                    }
                }
                if (c.assignment().size() == truth.size()) {
                    if (ends == null) ends = c.endOffsets(c.assignment(), WAIT);
                    for (TopicPartition tp : c.assignment()) {
                        if (stops.get(tp.partition()) < 0 && !done.contains(tp) && c.position(tp, WAIT) >= ends.get(tp)) {
                            commit.put(tp, new OffsetAndMetadata(c.position(tp, WAIT)));
                            done.add(tp);
                        }
                    }
                }
            }
            c.commitSync(commit, WAIT);
        }
        try (PrintWriter w = new PrintWriter(Files.newBufferedWriter(out))) {
            for (List<Rec> l : consumed.values()) for (Rec r : l) w.println(r.partition + " " + r.offset + " " + r.label);
        }
        TreeMap<Integer, Long> shown = new TreeMap<>();
        commit.forEach((tp, o) -> shown.put(tp.partition(), o.offset()));
        try (PrintWriter w = new PrintWriter(Files.newBufferedWriter(Path.of(out + ".commit")))) {
            shown.forEach((p, o) -> w.println(p + " " + o));
        }
        System.out.printf("%-20s committed %s on the source%n", group, shown);
    }

    // --- settle: wait for the destinations ---------------------------------------

    static Map<Integer, Long> committed(Admin admin, String group, String topic) throws Exception {
        Map<TopicPartition, OffsetAndMetadata> m =
                admin.listConsumerGroupOffsets(group).partitionsToOffsetAndMetadata().get(30, TimeUnit.SECONDS);
        TreeMap<Integer, Long> out = new TreeMap<>();
        m.forEach((tp, o) -> {
            if (tp.topic().equals(topic) && o != null) out.put(tp.partition(), o.offset());
        });
        return out;
    }

    static long count(Map<Integer, List<Rec>> recs) {
        return recs.values().stream().mapToLong(List::size).sum();
    }

    static void settle(String[] a) throws Exception {
        need(a, 7);
        String topic = a[0];
        TreeMap<Integer, List<Rec>> truth = readRecs(Path.of(a[1]));
        List<String> groups = List.of(a[2].split(","));
        long stable = Long.parseLong(a[3]) * 1000, min = Long.parseLong(a[4]) * 1000, timeout = Long.parseLong(a[5]) * 1000;
        Map<String, String> dests = new LinkedHashMap<>();
        for (int i = 6; i < a.length; i++) {
            String[] kv = a[i].split("=", 2);
            dests.put(kv[0], kv[1]);
        }
        long start = System.currentTimeMillis(), want = count(truth);
        Map<String, Long> caughtUp = new HashMap<>(), changed = new HashMap<>();
        Map<String, Map<String, Map<Integer, Long>>> last = new HashMap<>();
        Map<String, Admin> admins = new LinkedHashMap<>();
        dests.forEach((name, b) -> admins.put(name, Admin.create(common(b))));
        try {
            while (true) {
                long now = System.currentTimeMillis();
                boolean all = true;
                StringBuilder status = new StringBuilder();
                for (var d : dests.entrySet()) {
                    String name = d.getKey();
                    if (!caughtUp.containsKey(name)) {
                        long have = 0;
                        try {
                            have = count(readAll(d.getValue(), topic));
                        } catch (Exception e) {
                            // The topic may not exist there yet.
                        }
                        if (have >= want) caughtUp.put(name, now);
                        status.append(String.format(" %s: %d of %d records;", name, have, want));
                        all = false;
                        continue;
                    }
                    Map<String, Map<Integer, Long>> offsets = new TreeMap<>();
                    for (String g : groups) offsets.put(g, committed(admins.get(name), g, topic));
                    if (!offsets.equals(last.get(name))) {
                        last.put(name, offsets);
                        changed.put(name, now);
                    }
                    long quiet = now - changed.get(name), since = now - caughtUp.get(name);
                    long synced = offsets.values().stream().filter(m -> !m.isEmpty()).count();
                    status.append(String.format(" %s: caught up %ds ago, %d of %d groups with offsets, unchanged for %ds;",
                            name, since / 1000, synced, groups.size(), quiet / 1000));
                    if (quiet < stable || since < min) all = false;
                }
                System.err.println("settle" + status);
                if (all) break;
                if (now - start > timeout) throw new IllegalStateException("the destinations did not settle in " + timeout / 1000 + " s");
                Thread.sleep(2000);
            }
            for (var d : last.entrySet()) {
                for (var g : d.getValue().entrySet()) System.out.printf("%s %s %s%n", d.getKey(), g.getKey(), g.getValue());
            }
        } finally {
            admins.values().forEach(Admin::close);
        }
    }

    // --- failover: each group consumes on a destination --------------------------

    static void failover(String[] a) throws Exception {
        need(a, 5);
        String bootstrap = a[0], topic = a[1], side = a[4];
        List<String> groups = List.of(a[2].split(","));
        Path out = Path.of(a[3]);
        try (Admin admin = Admin.create(common(bootstrap))) {
            for (String group : groups) {
                Map<Integer, Long> start = committed(admin, group, topic);
                Map<Integer, List<Rec>> consumed = new TreeMap<>();
                int partitions;
                // auto.offset.reset=earliest: a partition without a commit is read
                // from its start, as a group new to the cluster would.
                try (KafkaConsumer<String, String> c = consumer(bootstrap, group, "earliest")) {
                    partitions = partitionsOf(c, topic).size();
                    c.subscribe(List.of(topic));
                    long deadline = System.nanoTime() + WAIT.toNanos();
                    Map<TopicPartition, Long> ends = null;
                    while (true) {
                        if (System.nanoTime() > deadline) throw new IllegalStateException(group + " on " + side + ": timed out");
                        for (ConsumerRecord<String, String> rec : c.poll(Duration.ofMillis(200))) {
                            consumed.computeIfAbsent(rec.partition(), k -> new ArrayList<>())
                                    .add(new Rec(rec.partition(), rec.offset(), rec.value()));
                        }
                        if (c.assignment().size() == partitions) {
                            if (ends == null) ends = c.endOffsets(c.assignment(), WAIT);
                            Map<TopicPartition, Long> e = ends;
                            if (c.assignment().stream().allMatch(tp -> c.position(tp, WAIT) >= e.get(tp))) break;
                        }
                    }
                }
                try (PrintWriter w = new PrintWriter(Files.newBufferedWriter(out.resolve(group + "." + side)))) {
                    for (List<Rec> l : consumed.values()) for (Rec r : l) w.println(r.partition + " " + r.offset + " " + r.label);
                }
                try (PrintWriter w = new PrintWriter(Files.newBufferedWriter(out.resolve(group + "." + side + ".start")))) {
                    for (int p = 0; p < partitions; p++) w.println(p + " " + (start.containsKey(p) ? start.get(p).toString() : "none"));
                }
            }
        }
    }

    // --- report --------------------------------------------------------------------

    record Outcome(int reread, int skipped, int aborted, int duplicates, String committed, String first) {}

    static Outcome outcome(List<Rec> truth, List<Rec> source, List<Rec> dest, String committed) {
        Set<String> onSource = new HashSet<>(), onDest = new HashSet<>();
        source.forEach(r -> onSource.add(r.label));
        int duplicates = 0, aborted = 0, reread = 0;
        for (Rec r : dest) {
            if (!onDest.add(r.label)) duplicates++;
            else if (onSource.contains(r.label)) reread++;
            if (r.label.contains("-a")) aborted++;
        }
        int skipped = 0;
        for (Rec r : truth) if (!onSource.contains(r.label) && !onDest.contains(r.label)) skipped++;
        return new Outcome(reread, skipped, aborted, duplicates, committed, dest.isEmpty() ? "-" : dest.get(0).label);
    }

    static Map<Integer, String> readStart(Path path) throws IOException {
        Map<Integer, String> out = new TreeMap<>();
        for (String line : Files.readAllLines(path)) {
            if (line.isBlank()) continue;
            String[] f = line.split(" ");
            out.put(Integer.parseInt(f[0]), f[1]);
        }
        return out;
    }

    static void report(String[] a) throws Exception {
        need(a, 4);
        TreeMap<Integer, List<Rec>> truth = readRecs(Path.of(a[0]));
        List<String> groups = List.of(a[1].split(","));
        Path dir = Path.of(a[2]);
        Map<String, String> sides = new LinkedHashMap<>();
        for (int i = 3; i < a.length; i++) {
            String[] kv = a[i].split("=", 2);
            sides.put(kv[0], kv[1]);
        }
        // group -> side -> partition -> outcome
        Map<String, Map<String, Map<Integer, Outcome>>> all = new LinkedHashMap<>();
        Map<String, Map<Integer, String>> sourceCommits = new LinkedHashMap<>();
        Map<String, Map<Integer, String>> next = new LinkedHashMap<>();
        for (String g : groups) {
            TreeMap<Integer, List<Rec>> source = readRecs(dir.resolve(g + ".source"));
            Map<Integer, String> commits = readStart(dir.resolve(g + ".source.commit"));
            Map<Integer, String> nexts = new TreeMap<>();
            for (var e : truth.entrySet()) {
                int p = e.getKey();
                int n = source.getOrDefault(p, List.of()).size();
                // The record the source commit names next (after the group's last one).
                nexts.put(p, n < e.getValue().size() ? e.getValue().get(n).label : "(end)");
            }
            sourceCommits.put(g, commits);
            next.put(g, nexts);
            Map<String, Map<Integer, Outcome>> bySide = new LinkedHashMap<>();
            for (String side : sides.keySet()) {
                TreeMap<Integer, List<Rec>> dest = readRecs(dir.resolve(g + "." + side));
                Map<Integer, String> start = readStart(dir.resolve(g + "." + side + ".start"));
                Map<Integer, Outcome> byPartition = new TreeMap<>();
                for (var e : truth.entrySet()) {
                    int p = e.getKey();
                    byPartition.put(p, outcome(e.getValue(), source.getOrDefault(p, List.of()),
                            dest.getOrDefault(p, List.of()), start.getOrDefault(p, "none")));
                }
                bySide.put(side, byPartition);
            }
            all.put(g, bySide);
        }

        List<String> names = new ArrayList<>(sides.keySet());
        System.out.println("Per group: records re-read (consumed on the source before the commit and again after the failover)");
        System.out.println("and skipped (consumed on neither side), summed over the partitions.");
        System.out.println();
        StringBuilder head = new StringBuilder(String.format("%-20s %-24s", "group", "source commit (p0,p1,..)"));
        for (String s : names) head.append(String.format(" | %-30s", sides.get(s) + ": re-read / skipped"));
        System.out.println(head);
        Map<String, int[]> totals = new LinkedHashMap<>();
        for (String g : groups) {
            StringBuilder line = new StringBuilder(String.format("%-20s %-24s", g, join(sourceCommits.get(g).values())));
            for (String s : names) {
                int rr = 0, sk = 0;
                for (Outcome o : all.get(g).get(s).values()) {
                    rr += o.reread;
                    sk += o.skipped;
                }
                int[] t = totals.computeIfAbsent(s, k -> new int[2]);
                t[0] += rr;
                t[1] += sk;
                line.append(String.format(" | %-30s", rr + " / " + sk));
            }
            System.out.println(line);
        }
        StringBuilder tot = new StringBuilder(String.format("%-20s %-24s", "total", ""));
        for (String s : names) tot.append(String.format(" | %-30s", totals.get(s)[0] + " / " + totals.get(s)[1]));
        System.out.println(tot);
        for (String s : names) {
            int ab = 0, dup = 0, none = 0;
            for (String g : groups) {
                for (Outcome o : all.get(g).get(s).values()) {
                    ab += o.aborted;
                    dup += o.duplicates;
                    if (o.committed.equals("none")) none++;
                }
            }
            System.out.printf("%s: %d records of aborted transactions read, %d records read twice, %d of %d group partitions without a commit (read from the start)%n",
                    sides.get(s), ab, dup, none, groups.size() * truth.size());
        }

        System.out.println();
        System.out.println("Per partition: the source commit and the record it names next; per destination the committed");
        System.out.println("offset there, the first record the group read after the failover, re-read, skipped.");
        System.out.println();
        StringBuilder h2 = new StringBuilder(String.format("%-20s %2s %-20s", "group", "p", "source commit: next"));
        for (String s : names) h2.append(String.format(" | %-44s", sides.get(s)));
        System.out.println(h2);
        for (String g : groups) {
            for (int p : truth.keySet()) {
                StringBuilder line = new StringBuilder(String.format("%-20s %2d %-20s", g, p,
                        sourceCommits.get(g).get(p) + ": " + next.get(g).get(p).replaceFirst("^p\\d+-", "")));
                for (String s : names) {
                    Outcome o = all.get(g).get(s).get(p);
                    line.append(String.format(" | %-44s", String.format("%s: %s, %d / %d", o.committed,
                            o.first.replaceFirst("^p\\d+-", ""), o.reread, o.skipped)));
                }
                System.out.println(line);
            }
        }
        // The exact translation must neither re-read nor skip: say so per side.
        for (String s : names) {
            List<String> bad = new ArrayList<>();
            for (String g : groups) {
                for (var e : all.get(g).get(s).entrySet()) {
                    Outcome o = e.getValue();
                    if (o.reread > 0 || o.skipped > 0 || o.aborted > 0 || o.duplicates > 0) {
                        bad.add(String.format("%s partition %d (source commit %s, next %s; committed there %s, first read %s: %d re-read, %d skipped, %d aborted, %d twice)",
                                g, e.getKey(), sourceCommits.get(g).get(e.getKey()), next.get(g).get(e.getKey()),
                                o.committed, o.first, o.reread, o.skipped, o.aborted, o.duplicates));
                    }
                }
            }
            System.out.println();
            if (bad.isEmpty()) {
                System.out.println(sides.get(s) + ": every group resumed at the next record it would have read on the source.");
            } else {
                System.out.println(sides.get(s) + ": " + bad.size() + " group partitions did not resume at their next record:");
                bad.forEach(b -> System.out.println("  " + b));
            }
        }
    }

    static String join(Collection<?> values) {
        List<String> s = new ArrayList<>();
        values.forEach(v -> s.add(Objects.toString(v)));
        return String.join(",", s);
    }
}
