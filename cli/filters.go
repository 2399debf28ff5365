package cli

import (
	"flag"
	"net/url"
	"time"
)

// filterFlags are the selector flags of ls and of the bulk actions: the
// admin API's list filters.
type filterFlags struct {
	dest, exchange, key, from, to, idPrefix, header *string
}

func addFilterFlags(fs *flag.FlagSet, what string) *filterFlags {
	return &filterFlags{
		dest:     fs.String("destination", "", what+" for this queue"),
		exchange: fs.String("exchange", "", what+" for this exchange"),
		key:      fs.String("routing-key", "", "with --exchange: "+what+" with this routing key"),
		from:     fs.String("from", "", what+" due at or after this time (RFC 3339 or a duration from now)"),
		to:       fs.String("to", "", what+" due before this time (RFC 3339 or a duration from now)"),
		idPrefix: fs.String("id-prefix", "", what+" whose id starts with this"),
		header:   fs.String("header", "", what+" whose message has this header with this text value, as `name:value` (e.g. tenant:acme)"),
	}
}

// filterSynopsis is the usage text of filterFlags.
const filterSynopsis = "[--destination Q | --exchange X [--routing-key K]] [--from T] [--to T] [--id-prefix P] [--header NAME:VALUE]"

// query checks the filter flags and returns them as the API's query; code
// is -1 unless the flags are wrong (then it is the exit code). set reports
// whether any filter was given.
func (ff *filterFlags) query(c *adminClient, fs *flag.FlagSet) (q url.Values, set bool, code int) {
	keySet := false
	fs.Visit(func(f *flag.Flag) { keySet = keySet || f.Name == "routing-key" })
	switch {
	case *ff.dest != "" && *ff.exchange != "":
		return nil, false, c.usageErr(fs, "give --destination (a queue) or --exchange, not both")
	case keySet && *ff.exchange == "":
		return nil, false, c.usageErr(fs, "--routing-key needs --exchange")
	}
	q = url.Values{}
	for name, v := range map[string]string{"destination": *ff.dest, "exchange": *ff.exchange, "id_prefix": *ff.idPrefix, "header": *ff.header} {
		if v != "" {
			q.Set(name, v)
		}
	}
	if keySet {
		q.Set("routing_key", *ff.key)
	}
	now := time.Now()
	for name, v := range map[string]string{"due_from": *ff.from, "due_to": *ff.to} {
		if v == "" {
			continue
		}
		t, err := parseWhen(v, now)
		if err != nil {
			return nil, false, c.usageErr(fs, "--%s: %v", map[string]string{"due_from": "from", "due_to": "to"}[name], err)
		}
		q.Set(name, t.UTC().Format(time.RFC3339Nano))
	}
	return q, len(q) > 0, -1
}

// parse parses args (flags anywhere) and then the filter flags; see query.
func (ff *filterFlags) parse(c *adminClient, fs *flag.FlagSet, args []string) (pos []string, q url.Values, set bool, code int) {
	pos, code = parseFlags(fs, args, c.out, c.errOut)
	if code >= 0 {
		return nil, nil, false, code
	}
	q, set, code = ff.query(c, fs)
	return pos, q, set, code
}
