package awsbudget

import (
	"net/url"
	"reflect"
	"strings"

	"github.com/runbudget/runbudget/budget"
)

// Resource is what one S3 operation touches, as the domain function sees it.
type Resource struct {
	// Operation is the SDK's operation name, e.g. "GetObject".
	Operation string
	// Region is the client's region for the call (the operation's Region
	// option, else the client's).
	Region string
	// Bucket is the bucket named by the operation; empty for account-level
	// operations such as ListBuckets.
	Bucket string
	// Key is the object key, or a listing's prefix; empty when the operation
	// names neither.
	Key string
}

// DefaultDomain is one domain per bucket and region:
// {Version: 1, ID: "s3:" + region + ":" + bucket}. An operation without a
// bucket (ListBuckets, ListDirectoryBuckets) falls in the region's
// account-level domain "s3:" + region + ":".
//
// S3 meters request rates per partitioned prefix, and partitions a busy
// bucket on its own as load grows; a bucket is the widest scope that is
// always right to share. A job whose traffic spreads over prefixes S3 is
// known to have partitioned can return a domain per prefix instead
// (WithDomain), which lets it run that many times faster.
func DefaultDomain(r Resource) budget.Domain {
	return budget.Domain{Version: 1, ID: "s3:" + r.Region + ":" + r.Bucket}
}

// classes maps the operations whose class is not plain from their name.
// Everything else follows the prefix rules of DefaultClass.
var classes = map[string]budget.OpClass{
	"GetObject":        budget.OpGet,
	"GetObjectTorrent": budget.OpGet,

	"ListParts": budget.OpList,

	"PutObject":               budget.OpPut,
	"UploadPart":              budget.OpPut,
	"CreateMultipartUpload":   budget.OpPut,
	"CompleteMultipartUpload": budget.OpPut,
	"CopyObject":              budget.OpPut,
	"UploadPartCopy":          budget.OpPut,

	"DeleteObject":         budget.OpDelete,
	"DeleteObjects":        budget.OpDelete,
	"AbortMultipartUpload": budget.OpDelete,
}

// DefaultClass maps an S3 operation to the class it is charged as:
//
//   - GetObject, GetObjectTorrent: OpGet, holding a body slot until the
//     output's Body is closed.
//   - List* (ListObjects, ListObjectsV2, ListObjectVersions, ListParts,
//     ListMultipartUploads, ListBuckets, ...): OpList.
//   - HeadObject, HeadBucket, and every other Get* (GetObjectAttributes,
//     GetObjectTagging, GetBucketLocation, ...): OpHead, since they read
//     metadata and no content.
//   - PutObject, UploadPart, CreateMultipartUpload, CompleteMultipartUpload,
//     CopyObject, UploadPartCopy, and every other Put* or Create*: OpPut.
//   - DeleteObject, DeleteObjects, AbortMultipartUpload, and every other
//     Delete*: OpDelete.
//   - Anything else (SelectObjectContent, RestoreObject, operations added to
//     the SDK later): OpPut. S3 meters writes at the lower rate (3,500 a
//     second per prefix against 5,500 for reads), and most of these are POST
//     requests, which it counts with the writes, so charging an unknown
//     operation as a write is the cautious mistake.
func DefaultClass(operation string) budget.OpClass {
	if c, ok := classes[operation]; ok {
		return c
	}
	switch {
	case strings.HasPrefix(operation, "List"):
		return budget.OpList
	case strings.HasPrefix(operation, "Head"), strings.HasPrefix(operation, "Get"):
		return budget.OpHead
	case strings.HasPrefix(operation, "Delete"):
		return budget.OpDelete
	default:
		return budget.OpPut
	}
}

// resources returns what params touches: the operation's own resource, and
// for a server-side copy (an input with a CopySource) the copy's source.
// S3 inputs are pointers to structs with *string fields named Bucket, Key,
// Prefix and CopySource; reading them by name covers every operation,
// including those added to the SDK after this package was written.
func resources(operation, region string, params any) (target Resource, source *Resource) {
	target = Resource{Operation: operation, Region: region}
	v := reflect.ValueOf(params)
	if v.Kind() != reflect.Pointer || v.IsNil() || v.Elem().Kind() != reflect.Struct {
		return target, nil
	}
	v = v.Elem()
	target.Bucket = stringField(v, "Bucket")
	target.Key = stringField(v, "Key")
	if target.Key == "" {
		target.Key = stringField(v, "Prefix")
	}
	if cs := stringField(v, "CopySource"); cs != "" {
		if b, k, ok := parseCopySource(cs); ok {
			source = &Resource{Operation: operation, Region: region, Bucket: b, Key: k}
		}
	}
	return target, source
}

// stringField reads the *string field name of struct v, or "".
func stringField(v reflect.Value, name string) string {
	f := v.FieldByName(name)
	if !f.IsValid() || f.Kind() != reflect.Pointer || f.IsNil() || f.Elem().Kind() != reflect.String {
		return ""
	}
	return f.Elem().String()
}

// parseCopySource splits an x-amz-copy-source value, "bucket/key" with an
// optional leading slash and "?versionId=...", URL-encoded as S3 requires,
// into its bucket and key. An access point or Outposts ARN source
// ("arn:aws:s3:...:accesspoint/name/object/key") names its access point as
// the bucket. ok is false when no bucket can be found.
func parseCopySource(cs string) (bucket, key string, ok bool) {
	if i := strings.IndexByte(cs, '?'); i >= 0 {
		cs = cs[:i]
	}
	if dec, err := url.PathUnescape(cs); err == nil {
		cs = dec
	}
	cs = strings.TrimPrefix(cs, "/")
	if strings.HasPrefix(cs, "arn:") {
		if i := strings.Index(cs, "/object/"); i >= 0 {
			return cs[:i], cs[i+len("/object/"):], true
		}
		return "", "", false
	}
	bucket, key, _ = strings.Cut(cs, "/")
	return bucket, key, bucket != ""
}
